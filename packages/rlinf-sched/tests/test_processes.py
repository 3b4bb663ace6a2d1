"""Which components share a worker process (`rlinf.sched.process_sets`)."""

from __future__ import annotations

from rlinf.sched import Component, Workflow, parse_placement, process_of, process_sets


def sets(spec: str, names: tuple[str, ...], num_devices: int,
         isolated: tuple[str, ...] = ()) -> tuple[tuple[str, ...], ...]:
    placement = parse_placement(spec, components=list(names), num_devices=num_devices)
    return process_sets(placement, isolated=isolated)


NAMES = ("rollout", "reward", "inference", "actor")


def test_components_on_the_same_devices_share_one_process_per_rank() -> None:
    assert sets("collocated", NAMES, 2) == (NAMES,)
    assert sets("rollout: 0, reward,inference,actor: 1", NAMES, 2) == (
        ("rollout",), ("reward", "inference", "actor"))
    assert sets("rollout: 0, reward: 1, inference: 2, actor: 3", NAMES, 4) == tuple(
        (n,) for n in NAMES)


def test_partly_shared_devices_or_other_process_counts_keep_processes_apart() -> None:
    # rollout on 0-1 and actor on 1 share device 1 but not all devices: each its own.
    assert sets("rollout,reward: 0-1, inference: 0, actor: 1", NAMES, 2) == (
        ("rollout", "reward"), ("inference",), ("actor",))
    # Two processes per device against one: ranks do not pair up.
    assert sets("rollout: 0 x2, reward,inference,actor: 0", NAMES, 1) == (
        ("rollout",), ("reward", "inference", "actor"))


def test_an_isolated_component_runs_alone() -> None:
    assert sets("collocated", NAMES, 2, isolated=("rollout",)) == (
        ("rollout",), ("reward", "inference", "actor"))
    placement = parse_placement("collocated", components=list(NAMES), num_devices=1)
    assert process_of(placement, isolated=("reward",)) == {
        "rollout": 0, "reward": 1, "inference": 0, "actor": 0}


def test_isolated_round_trips_through_the_workflow_file() -> None:
    wf = Workflow((Component("env", isolated=True), Component("policy")), (), global_batch=1)
    again = Workflow.from_dict(wf.to_dict())
    assert [c.isolated for c in again.components] == [True, False]
    assert "isolated" not in wf.to_dict()["components"][1]
