"""`FlowRun` and `launch_auto` on a real local Ray with toy components (no model, so each
launch takes seconds): streaming through consumer-owned channels, the device lock where
devices are shared, phases and profiles, weight sync, and teardown on success, on a dead
rank (named, never a hang), on a failing constructor and on Ctrl-C."""

from __future__ import annotations

import _thread
import dataclasses
import itertools
import math
import threading
import time
from collections.abc import Iterator

import numpy as np
import pytest
import ray

from rlinf.comm import live_segments, orphaned_segments
from rlinf.sched import Cluster, Component, Edge, Loop
from rlinf.workers.errors import ConfigError, WorkerDiedError
from rlinf.workers.flow import (
    ChannelSpec,
    ComponentSpec,
    FlowClosedError,
    FlowDeclarationError,
    FlowRun,
    MacroFlow,
    WeightSyncSpec,
    launch_auto,
)
from rlinf.workers.flow.auto import (
    COLLOCATED_ITERATION,
    COLLOCATED_PLANS,
    CONTROL,
    PROBE_ITERATION,
    WEIGHT_SYNC,
    merge_run_profiles,
    run_profile,
)
from rlinf.workers.flow.records import EDGE_BYTES

from ..leaks import eventually, live_ranks
from .toys import (
    LoopEnv,
    LoopPolicy,
    ReceivingRelay,
    Relay,
    Sink,
    Source,
    TrainingRelay,
    act,
)

ITEMS, UNIT = 8, 2


def declare(*, sink_kwargs: dict | None = None, source_kwargs: dict | None = None,
            relay: bool = False, isolated: tuple[str, ...] = ()) -> MacroFlow:
    def part(name: str, resource: str = "gpu") -> Component:
        return Component(name, resource=resource, batch=ITEMS, micro_batch_multiple=UNIT,
                         isolated=name in isolated)

    parts = [ComponentSpec(part("source", "cpu"), Source, entry="produce",
                           init_kwargs={"io_timeout": 60, **(source_kwargs or {})})]
    if relay:
        parts.append(ComponentSpec(part("relay"), Relay, entry="relay"))
    parts.append(ComponentSpec(part("sink"), Sink, entry="consume",
                               init_kwargs={"io_timeout": 60, **(sink_kwargs or {})},
                               setup="build", distributed=True))
    names = [p.name for p in parts]
    channels = tuple(ChannelSpec(Edge(a, b, bytes_per_item=16), granularity=UNIT)
                     for a, b in itertools.pairwise(names))
    return MacroFlow(tuple(parts), channels, weight_syncs=(WeightSyncSpec("sink", ("source",)),),
                     global_batch=ITEMS, name="toy")


ENVS, LOOP_STEPS, OFFSET = 4, 3, 7


def declare_loop(transport: str = "channel") -> MacroFlow:
    """env ↔ policy for `LOOP_STEPS` steps, then the trainer; the policy may run inline."""
    def part(name: str, resource: str = "gpu") -> Component:
        return Component(name, resource=resource, batch=ENVS)

    return MacroFlow(
        (ComponentSpec(part("env", "cpu"), LoopEnv, entry="rollout",
                       init_kwargs={"io_timeout": 60}),
         ComponentSpec(part("policy"), LoopPolicy, entry="serve",
                       init_kwargs={"offset": OFFSET, "io_timeout": 60}, inline_with="env",
                       inline_kwargs={"inline_offset": OFFSET}),
         ComponentSpec(part("actor"), Sink, entry="consume", init_kwargs={"io_timeout": 60})),
        (ChannelSpec(Edge("env", "policy"), transport=transport),
         ChannelSpec(Edge("policy", "env", feedback=True), transport=transport),
         ChannelSpec(Edge("env", "actor"))),
        weight_syncs=(WeightSyncSpec("actor", ("policy",)),),
        loops=(Loop(("env", "policy"), steps=LOOP_STEPS),), global_batch=ENVS, name="loop")


def loop_action_sum(step: int, version: int) -> int:
    obs = np.arange(ENVS) + 100 * step
    return sum(int(act(obs + t, OFFSET, version).sum()) for t in range(1, LOOP_STEPS + 1))


def our_actors() -> list[str]:
    """Ranks of these tests' flows still alive (on Ray: its actors, a shared process named
    ``source+sink-…``)."""
    if not ray.is_initialized():
        return live_ranks()
    return [name for name in live_ranks()
            if name.startswith(("source", "relay", "sink", "env", "policy", "actor",
                                "rlinf-flow-"))]


def processes(run: FlowRun) -> dict[str, set[int]]:
    """The pids of each launched component's ranks."""
    return {name: {info.pid for info in group.infos} for name, group in run.groups.items()}


@pytest.fixture
def clean(cluster: str) -> Iterator[None]:
    """Whatever a test launches is gone afterwards: actors, CPU reservations, segments."""
    before = live_segments()
    yield
    assert eventually(lambda: our_actors() == []), our_actors()
    if cluster == "ray":
        assert eventually(lambda: ray.available_resources().get("CPU")
                          == ray.cluster_resources().get("CPU"))
    assert eventually(lambda: not orphaned_segments(before)), orphaned_segments(before)


def test_collocated_components_stream_take_turns_and_sync(clean: None) -> None:
    flow = declare(relay=True)
    plan = flow.fixed_plan("source,relay,sink: 0", num_devices=1)
    with FlowRun.launch(flow, plan, timeout=120) as run:
        # One process serves all three: the weights are handed over in it.
        assert run.uses_device_lock and run.weight_transports == ("inprocess",)
        assert len(set().union(*processes(run).values())) == 1
        records = [run.step(k) for k in range(2)]
        profile = run.profile()
    for record in records:
        assert record.metrics["sink/sum"] == sum(range(ITEMS // UNIT))
        assert record.metrics["sink/in_order"] == 1.0 and record.metrics["sink/ready"] == 1.0
        assert [p.name for p in record.phases] == ["source", "relay", "sink", "weight_sync:sink"]
        assert record.lock_holds >= ITEMS // UNIT + 2  # one turn per unit and stage at least
        assert all(p.ended >= p.started >= 0 for p in record.phases)
        assert record.metrics["time/dataflow"] <= record.seconds
    # weights of iteration k reached the source before iteration k + 1
    assert [r.metrics["source/version"] for r in records] == [0.0, 1.0]
    assert {m.component for m in profile.measurements} == {"source", "relay", "sink"}
    phases = [m for m in profile.measurements if m.memory_source != "none"]  # not timed calls
    assert {m.component for m in phases} == {"source", "relay", "sink"}
    assert all(m.memory_source == "rss" and m.peak_memory_bytes > 0 for m in phases)
    assert profile.switches  # onload/offload as the three took turns on device 0


def test_a_run_profiles_itself_in_the_form_the_planner_fits(clean: None) -> None:
    flow = declare(sink_kwargs={"delay": 0.01})
    plan = flow.fixed_plan("source,sink: 0-1", num_devices=2)
    with FlowRun.launch(flow, plan, timeout=120) as run:
        for k in range(3):
            run.step(k)
        with pytest.raises(ConfigError, match="a profile needs one more"):
            run_profile(run, skip=3)
        measured = run_profile(run, skip=1)
    sink = [m for m in measured.measurements if m.component == "sink"]
    # per iteration: the phase (8 items on 2 devices) and each rank's timed call (4 on 1)
    assert sorted((m.batch_size, m.num_devices) for m in sink) == [(4, 1)] * 4 + [(8, 2)] * 2
    assert all(m.seconds >= 0.01 for m in sink)
    iterations = [m for m in measured.measurements if m.component == COLLOCATED_ITERATION]
    assert [(m.batch_size, m.num_devices) for m in iterations] == [(ITEMS, 2)] * 2
    assert set(measured.metadata[COLLOCATED_PLANS]) == {"2"}
    assert len([m for m in measured.measurements if m.component == WEIGHT_SYNC]) == 2
    # added to a cache: both runs' plans kept, at most a bounded number of points per size
    again = merge_run_profiles(measured, measured)
    assert len([m for m in again.measurements if m.component == "sink"]) == 12
    for _ in range(10):
        again = merge_run_profiles(again, measured)
    counts = [sum(1 for m in again.measurements
                  if (m.component, m.batch_size) == ("sink", size)) for size in (4, 8)]
    assert counts == [16, 16]
    assert merge_run_profiles(None, measured) is measured


def test_a_component_that_asks_for_isolation_gets_processes_of_its_own(clean: None) -> None:
    flow = declare(relay=True, isolated=("source",))
    plan = flow.fixed_plan("source,relay,sink: 0-1", num_devices=2)
    with FlowRun.launch(flow, plan, timeout=120) as run:
        pids = processes(run)
        # relay and sink share two processes (one per rank); the source runs in two others.
        assert pids["relay"] == pids["sink"] and len(pids["sink"]) == 2
        assert not pids["source"] & pids["sink"] and len(pids["source"]) == 2
        assert run.weight_transports == ("shm",)
        records = [run.step(k) for k in range(2)]
    assert [r.metrics["sink/sum"] for r in records] == [sum(range(ITEMS // UNIT)) / 2] * 2
    assert [r.metrics["source/version"] for r in records] == [0.0, 1.0]


def test_a_sync_to_receivers_inside_and_outside_the_trainers_process(clean: None) -> None:
    # relay shares the sink's process (in-process weights), the source runs apart (shm).
    plain = declare(relay=True)
    receiving = dataclasses.replace(plain.component("relay"), worker=ReceivingRelay)
    flow = dataclasses.replace(
        plain, components=tuple(receiving if c.name == "relay" else c for c in plain.components),
        weight_syncs=(WeightSyncSpec("sink", ("relay", "source")),))
    plan = flow.fixed_plan("source: 0, relay,sink: 1", num_devices=2)
    with FlowRun.launch(flow, plan, timeout=120) as run:
        assert run.weight_transports == ("inprocess+shm",)
        assert processes(run)["relay"] == processes(run)["sink"] != processes(run)["source"]
        records = [run.step(k) for k in range(2)]
    assert [r.metrics["source/version"] for r in records] == [0.0, 1.0]
    assert [r.metrics["relay/version"] for r in records] == [0.0, 1.0]


def test_disaggregated_consumer_ranks_get_their_shards_without_a_lock(clean: None) -> None:
    flow = declare()
    plan = flow.fixed_plan("source: 0, sink: 1-2", num_devices=3)
    with FlowRun.launch(flow, plan, timeout=120) as run:
        record = run.step(0)
        assert not run.uses_device_lock and record.lock_holds == 0
        assert run.groups["sink"].world_size == 2
    # each rank got its contiguous shard in order: units 0, 1 and 2, 3 (the mean of 1 and 5)
    assert record.metrics["sink/in_order"] == 1.0
    assert record.metrics["sink/sum"] == (0 + 1 + 2 + 3) / 2
    # every rank's own numbers are kept too, in rank order
    assert [m["sum"] for m in record.rank_metrics["sink"]] == [0 + 1, 2 + 3]


def test_only_components_that_share_a_device_take_turns_through_the_lock(clean: None) -> None:
    flow = declare(relay=True)
    plan = flow.fixed_plan("source: 0, relay,sink: 1", num_devices=2)
    with FlowRun.launch(flow, plan, timeout=120) as run:
        assert run.uses_device_lock
        record = run.step(0)
    holds = {p.name: p.lock_holds for p in record.phases}
    assert holds["source"] == 0  # alone on device 0: its turns skip the lock's round trips
    assert holds["relay"] >= 1 and holds["sink"] >= 1  # device 1 is taken in turns
    assert record.metrics["sink/sum"] == sum(range(ITEMS // UNIT))


@pytest.mark.parametrize(("placement", "transport", "inlined", "locked"), [
    ("env,policy,actor: 0", "p2p", {"policy": "env"}, True),  # policy inside the env
    ("env,policy: 0, actor: 1", "channel", {"policy": "env"}, False),
    ("env: 0, policy: 1, actor: 0-1", "channel", {}, True),  # the loop over channels
    ("env: 0, policy: 1, actor: 0-1", "p2p", {}, True),  # ... over endpoint messages
    ("env: 0, policy: 1, actor: 2", "p2p", {}, False),
])
def test_a_loop_runs_over_its_channels_or_inside_its_host(
        clean: None, placement: str, transport: str, inlined: dict[str, str],
        locked: bool) -> None:
    flow = declare_loop(transport)
    with FlowRun.launch(flow, flow.fixed_plan(placement, num_devices=3), timeout=120) as run:
        assert run.inlined == inlined and set(run.groups) == {"env", "actor", "policy"} - set(
            inlined)
        assert run.uses_device_lock is locked
        records = [run.step(k) for k in range(2)]
        profile = run.profile()
    # every placement computes the same actions; the weights of iteration k (the trainer's
    # version) reach the policy, wherever it runs, before iteration k + 1
    assert [r.metrics["env/action_sum"] for r in records] == [
        loop_action_sum(0, version=0), loop_action_sum(1, version=1)]
    for record in records:
        assert [p.name for p in record.phases] == ["env", "policy", "actor",
                                                  "weight_sync:actor"]
        assert record.phase("policy").busy_seconds > 0  # inlined: the host's time on it
        assert record.metrics["actor/in_order"] == 1.0
        assert ("policy/served" in record.metrics) is not bool(inlined)
    assert {m.component for m in profile.measurements} == {"env", "policy", "actor"}


def test_with_a_policy_lag_the_trainer_trains_the_previous_iteration_beside_the_next(
        clean: None) -> None:
    """policy_lag=1: step k produces iteration k while the trainer trains on k-1's data
    (waiting in its channel); its weights reach the source one iteration later than without
    a lag; `drain` trains the last iteration alone."""
    flow = dataclasses.replace(declare(sink_kwargs={"delay": 1.0},
                                       source_kwargs={"delay": 0.25}), policy_lag=1)
    lagged = flow.to_sched_workflow()
    assert [e.lagged for e in lagged.edges] == [True]  # the planner sees the lag too
    with FlowRun.launch(flow, flow.fixed_plan("source: 0, sink: 1", num_devices=2),
                        timeout=120, trace=True) as run:
        assert run.pending_step is None
        records = [run.step(k) for k in range(3)]
        assert run.pending_step == 2
        spans = run.drain_spans()
        tail = run.drain()
        assert run.pending_step is None and run.drain() is None
    assert [[p.name for p in r.phases] for r in records] == [
        ["source"], ["source", "sink", "weight_sync:sink"], ["source", "sink", "weight_sync:sink"]]
    assert [r.trained_step for r in records] == [None, 0, 1]
    assert [r.metrics["sink/data_step"] for r in records[1:]] == [0.0, 1.0]
    assert all(r.metrics["sink/sum"] == sum(range(ITEMS // UNIT)) for r in records[1:])
    # the source acted with the weights trained on the data two iterations back
    assert [r.metrics["source/version"] for r in records] == [0.0, 0.0, 1.0]
    assert tail is not None and tail.step == tail.trained_step == 2
    assert [p.name for p in tail.phases] == ["sink", "weight_sync:sink"]
    assert tail.metrics["sink/data_step"] == 2.0
    # the update of iteration k-1 ran while iteration k's units were produced
    consumes = [s for s in spans if s.name == "consume"]
    produces = [s for s in spans if s.name == "produce"]
    assert len(consumes) == 2 and all(
        any(p.start < c.end and c.start < p.end for p in produces) for c in consumes)


def test_a_policy_lag_with_the_policy_inside_the_env_keeps_the_loop_exact(clean: None) -> None:
    flow = dataclasses.replace(declare_loop(), policy_lag=1)
    with FlowRun.launch(flow, flow.fixed_plan("env,policy: 0, actor: 1", num_devices=2),
                        timeout=120) as run:
        records = [run.step(k) for k in range(2)]
        last = run.iteration(2, drain=True)  # the step, then the drain of what it produced
        records.append(last[0])
        assert [r.trained_step for r in last] == [1, 2] and run.pending_step is None
        assert run.iteration(3) == tuple(run.records[-1:])  # without drain: the step alone
    assert [r.metrics["env/action_sum"] for r in records] == [
        loop_action_sum(0, version=0), loop_action_sum(1, version=0),
        loop_action_sum(2, version=1)]
    assert [r.metrics.get("actor/data_step") for r in records] == [None, 0.0, 1.0]


@pytest.mark.parametrize(("lag", "syncs", "error"), [
    (2, None, "policy_lag must be 0"),
    (1, (), "declares no weight sync"),
    (1, (WeightSyncSpec("relay", ("source",)),), r"only output is their weights.*relay->sink"),
])
def test_a_policy_lag_the_flow_cannot_run_is_refused_where_it_is_declared(
        lag: int, syncs: tuple[WeightSyncSpec, ...] | None, error: str) -> None:
    flow = declare(relay=True)
    components = tuple(dataclasses.replace(c, worker=TrainingRelay) if c.name == "relay"
                       else c for c in flow.components)
    with pytest.raises(FlowDeclarationError, match=error):
        dataclasses.replace(flow, components=components, policy_lag=lag,
                            weight_syncs=flow.weight_syncs if syncs is None else syncs)


def test_a_policy_lag_with_the_trainer_inside_a_generator_is_refused() -> None:
    flow = declare_loop()
    actor = dataclasses.replace(flow.component("actor"), inline_with="env")
    flow = dataclasses.replace(flow, components=tuple(
        actor if c.name == "actor" else c for c in flow.components), policy_lag=1)
    with pytest.raises(FlowDeclarationError, match="in one process"):
        FlowRun.launch(flow, flow.fixed_plan("env,policy,actor: 0", num_devices=1))


def test_a_p2p_edge_between_rank_counts_that_do_not_divide_is_refused(clean: None) -> None:
    flow = declare_loop("p2p")
    with pytest.raises(FlowDeclarationError,
                       match=r"p2p, which pairs the ranks.*'env': 2, 'policy': 3"):
        FlowRun.launch(flow, flow.fixed_plan("env: 0-1, policy: 2-4, actor: 0",
                                             num_devices=5), timeout=120)
    assert our_actors() == []  # refused from the plan, before any worker started


@pytest.mark.parametrize("shared", [False, True])
def test_a_dead_rank_is_named_and_the_flow_torn_down(clean: None, shared: bool) -> None:
    flow = declare(sink_kwargs={"exit_on_step": 1}, isolated=() if shared else ("sink",))
    run = FlowRun.launch(flow, flow.fixed_plan("source,sink: 0", num_devices=1), timeout=120)
    run.step(0)
    with pytest.raises(WorkerDiedError) as caught:
        run.step(1)  # the sink exits while the source streams into its channel
    if shared:  # one process served both: the error names the process's other member
        assert caught.value.role in ("source", "sink") and caught.value.rank == 0
        assert "shared with" in str(caught.value)
    else:
        assert caught.value.role == "sink" and caught.value.rank == 0
    with pytest.raises(FlowClosedError):
        run.step(2)


@pytest.mark.parametrize("placement", ["source: 0, sink: 1", "source,sink: 0-1"])
def test_a_failing_constructor_leaves_nothing_behind(clean: None, placement: str) -> None:
    # Alone or in a process it shares with the sink, the source's constructor is named.
    flow = declare(source_kwargs={"fail_init": True})
    with pytest.raises(WorkerDiedError, match="refuses to start") as caught:
        FlowRun.launch(flow, flow.fixed_plan(placement, num_devices=2), timeout=120)
    assert caught.value.role == "source" and caught.value.method == "__init__"


def test_ctrl_c_during_a_step_tears_everything_down(clean: None) -> None:
    flow = declare(source_kwargs={"delay": 5.0})
    run = FlowRun.launch(flow, flow.fixed_plan("source: 0, sink: 1", num_devices=2),
                         timeout=120)
    # Ctrl-C once a second until the step gives up, as a user does: a wait may swallow the
    # first (`keep_interrupts` raises it again), and a later one may land in the teardown.
    stop = threading.Event()

    def press_ctrl_c() -> None:
        while not stop.wait(1.0) and not run.closed:  # never into the teardown it started
            _thread.interrupt_main()

    presser = threading.Thread(target=press_ctrl_c, daemon=True)
    started = time.monotonic()
    presser.start()
    try:
        with pytest.raises(KeyboardInterrupt):
            run.step(0)
    finally:
        stop.set()
        presser.join()
    assert time.monotonic() - started < 5.0, "the step ran to its end: Ctrl-C was ignored"
    with pytest.raises(FlowClosedError):
        run.step(1)


def test_a_second_ctrl_c_during_the_teardown_does_not_cut_it_short(
        clean: None, monkeypatch: pytest.MonkeyPatch) -> None:
    # CI, 2026-12-02: the first Ctrl-C was raised again at the end of a wait slice, and the
    # next one landed in the teardown's check of the cluster: the flow was left running.
    from rlinf.workers.flow import run as run_module

    def reachable_under_a_second_ctrl_c(timeout: float = 2.0) -> bool:
        _thread.interrupt_main()
        time.sleep(0.5)  # it would surface here
        return True

    flow = declare(source_kwargs={"delay": 5.0})
    run = FlowRun.launch(flow, flow.fixed_plan("source: 0, sink: 1", num_devices=2),
                         timeout=120)
    monkeypatch.setattr(run_module, "cluster_reachable", reachable_under_a_second_ctrl_c)
    presser = threading.Timer(1.0, _thread.interrupt_main)
    presser.start()
    try:
        with pytest.raises(KeyboardInterrupt):
            run.step(0)
    finally:
        presser.cancel()
    assert run.closed
    with pytest.raises(FlowClosedError):
        run.step(1)


def test_a_plan_that_does_not_fit_the_flow_is_refused_before_launch(clean: None) -> None:
    flow = declare(relay=True)
    plan = declare().fixed_plan("source: 0, sink: 1", num_devices=2)
    with pytest.raises(FlowDeclarationError, match="places"):
        FlowRun.launch(flow, plan)
    ipc = dataclasses.replace(declare(), device="cuda", weight_syncs=(
        WeightSyncSpec("sink", ("source",), "cuda_ipc"),))
    with pytest.raises(FlowDeclarationError, match=r"forces 'cuda_ipc', but \['source'\]"):
        FlowRun.launch(ipc, ipc.fixed_plan("source: 0, sink: 1", num_devices=2))
    assert our_actors() == []  # refused before any rank starts


def test_each_edges_bytes_per_item_is_measured_on_its_channel(clean: None) -> None:
    """What the runtime measures, a declaration need not estimate: the profile carries the
    bytes per item each channel carried (int64 units: 8 bytes an item), p2p edges too."""
    flow = declare(relay=True)
    placement = "source: 0, relay,sink: 1"
    with FlowRun.launch(flow, flow.fixed_plan(placement, num_devices=2), timeout=120) as run:
        first, second = run.step(0), run.step(1)
        profile = run.profile()
    assert first.phase("source").sent == {"source->relay": (float(ITEMS), 8 * ITEMS)}
    assert second.phase("relay").sent == {"relay->sink": (float(ITEMS), 8 * ITEMS)}
    assert first.phase("sink").sent == {}  # no output
    assert profile.metadata[EDGE_BYTES] == {"source->relay": 8.0, "relay->sink": 8.0}
    # A loop's p2p edges: a message of every env's int64 observation (or action) per step.
    loop = declare_loop("p2p")
    with FlowRun.launch(loop, loop.fixed_plan("env: 0, policy: 1, actor: 0", num_devices=2),
                        timeout=120) as run:
        run.step(0)
        measured = run.profile().metadata[EDGE_BYTES]
    assert measured["env->policy"] == measured["policy->env"] == 8.0


def test_a_runs_inputs_reach_their_components_over_the_declared_arguments(
        clean: None) -> None:
    """The declaration stays one value; what a run feeds it goes to the launch."""
    flow = declare()
    plan = flow.fixed_plan("source: 0, sink: 1", num_devices=2)
    with pytest.raises(WorkerDiedError, match="refuses to start"):
        FlowRun.launch(flow, plan, timeout=120, inputs={"source": {"fail_init": True}})
    assert eventually(lambda: our_actors() == [])
    with FlowRun.launch(flow, plan, timeout=120, inputs={"sink": {"delay": 0.0}}) as run:
        assert run.step(0).metrics["sink/sum"] == sum(range(ITEMS // UNIT))
        assert run.drain_spans() == []  # no trace asked for


def test_inputs_for_a_component_not_launched_are_refused_before_launch(clean: None) -> None:
    flow = declare()
    with pytest.raises(FlowDeclarationError, match=r"\['judge'\], which the flow does not"):
        FlowRun.launch(flow, flow.fixed_plan("source: 0, sink: 1", num_devices=2),
                       inputs={"judge": {"weight": 1.0}})
    with pytest.raises(FlowDeclarationError, match=r"inputs for \['sink'\] are not mappings"):
        FlowRun.launch(flow, flow.fixed_plan("source: 0, sink: 1", num_devices=2),
                       inputs={"sink": [("delay", 0.0)]})
    loop = declare_loop()  # co-placed with env, the policy is served inside env's process
    with pytest.raises(FlowDeclarationError, match=r"inside \['env'\]'s process"):
        FlowRun.launch(loop, loop.fixed_plan("env,policy: 0, actor: 1", num_devices=2),
                       inputs={"policy": {"offset": 1}})
    assert our_actors() == []


@pytest.mark.skipif(Cluster.discover(use_ray=False).has_gpus,
                    reason="checks the error on a machine without GPUs")
def test_a_cuda_flow_without_a_gpu_is_refused_before_anything_starts(clean: None) -> None:
    flow = dataclasses.replace(declare(), device="cuda")
    with pytest.raises(ConfigError, match=r"computes on CUDA, but .* has 0 GPUs"):
        FlowRun.launch(flow, flow.fixed_plan("source: 0, sink: 1", num_devices=2))
    assert our_actors() == []


def test_loop_components_on_partly_shared_devices_are_refused_before_launch(
        clean: None) -> None:
    # env on 0-1 and the policy on 0: env rank 0 and the policy would each hold device 0
    # for their whole part of the loop while waiting for the other (found on two Ray
    # nodes, where it hung until the io timeout)
    flow = declare_loop()
    with pytest.raises(FlowDeclarationError, match=r"'env' and 'policy'.*device\(s\) \[0\]"):
        FlowRun.launch(flow, flow.fixed_plan("env: 0-1, policy: 0, actor: 0", num_devices=2))
    assert our_actors() == []


def test_auto_profiles_plans_and_launches_the_best_plan(clean: None) -> None:
    flow = declare(source_kwargs={"delay": 0.01})
    cluster = Cluster.discover(cpu_slots=2)
    run, report = launch_auto(flow, cluster, batch_sizes=[4, 8], timeout=120)
    with run:
        records = [run.step(k) for k in range(2)]
    sizes = {(m.component, m.batch_size, m.num_devices) for m in report.profile.measurements
             if m.memory_source != "none" or m.component != "sink"}
    # collocated probes on 1 and 2 slots with their weight syncs and control time, then (CPU
    # slots of known cores) a pipelined one
    assert sizes == {(c, b, n) for c in ("source", "sink", COLLOCATED_ITERATION)
                     for b in (4, 8) for n in (1, 2)} | \
        {(WEIGHT_SYNC, 1, 1), (CONTROL, 1, 1), (PROBE_ITERATION, 8, 2)}
    # and the sink's timed calls: each rank's shard of each size, on its one slot
    calls = {(m.batch_size, m.num_devices) for m in report.profile.measurements
             if m.component == "sink" and m.memory_source == "none"}
    assert calls == {(2, 1), (4, 1), (8, 1)}
    assert report.profile.metadata["probe_plan"]["spec"] == "source: 0, sink: 1"
    assert {n: plan["spec"] for n, plan in report.profile.metadata[COLLOCATED_PLANS].items()
            } == {"1": "source,sink: 0", "2": "source,sink: 0-1"}
    assert run.plan == report.plan == report.ranked.best
    assert math.isfinite(report.predicted_seconds) and report.predicted_seconds > 0
    compared = report.compare(records)
    assert compared["measured_s"] > 0 and math.isfinite(compared["relative_error"])
