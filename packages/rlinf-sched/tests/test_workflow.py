"""Workflow graph: validation, dependency order, loops, files."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from rlinf.sched.errors import PlanningError
from rlinf.sched.workflow import Component, Edge, Loop, Workflow, WorkflowError


def embodied() -> Workflow:
    return Workflow(
        components=(Component("actor"), Component("rollout"), Component("env", resource="cpu")),
        edges=(Edge("env", "rollout", bytes_per_item=10), Edge("rollout", "env", feedback=True),
               Edge("rollout", "actor", bytes_per_item=100)),
        global_batch=8, loops=(Loop(("env", "rollout"), 5),), name="emb")


def test_order_follows_dependencies_and_keeps_loops_together() -> None:
    wf = embodied()
    assert wf.order == ("env", "rollout", "actor")
    assert wf.steps_of("env") == 5 and wf.steps_of("actor") == 1
    assert wf.loop_of("rollout") == 0 and wf.loop_of("actor") is None
    assert [e.key for e in wf.inputs("env")] == ["rollout->env"]
    assert wf.edge_items(wf.edges[0]) == 8


def test_cycle_without_feedback_is_rejected() -> None:
    with pytest.raises(WorkflowError, match="cycle"):
        Workflow((Component("a"), Component("b")), (Edge("a", "b"), Edge("b", "a")))


def test_feedback_edge_must_stay_inside_one_loop() -> None:
    with pytest.raises(WorkflowError, match="feedback"):
        Workflow((Component("a"), Component("b")), (Edge("b", "a", feedback=True),))


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"resource": "tpu"}, "resource"),
        ({"batch": 0}, "batch"),
        ({"device_multiple": 0}, "device_multiple"),
        ({"min_devices": 4, "max_devices": 2}, "max_devices"),
        ({"completion": ((0.5, 0.7), (0.4, 1.0))}, "completion"),
        ({"completion": ((0.5, 0.5),)}, "end at"),
    ],
)
def test_component_validation(kwargs: dict[str, object], match: str) -> None:
    with pytest.raises(WorkflowError, match=match):
        Component("x", **kwargs)  # type: ignore[arg-type]


def test_unknown_edge_endpoint_and_duplicates() -> None:
    with pytest.raises(WorkflowError, match="unknown component 'c'"):
        Workflow((Component("a"),), (Edge("a", "c"),))
    with pytest.raises(WorkflowError, match="duplicate"):
        Workflow((Component("a"), Component("a")))
    assert issubclass(WorkflowError, PlanningError)


def test_allows_and_time_fraction() -> None:
    c = Component("r", device_multiple=2, min_devices=2, max_devices=8, streaming=True,
                  completion=((0.5, 0.25), (1.0, 1.0)))
    assert [n for n in range(1, 11) if c.allows(n)] == [2, 4, 6, 8]
    assert c.time_fraction(0.5) == pytest.approx(0.25)
    assert c.time_fraction(0.75) == pytest.approx(0.625)
    assert c.time_fraction(1.0) == pytest.approx(1.0)


def test_file_round_trip_json_and_yaml(tmp_path: Path) -> None:
    wf = embodied()
    path = tmp_path / "wf.json"
    path.write_text(json.dumps(wf.to_dict()))
    assert Workflow.from_file(path) == wf
    yaml = pytest.importorskip("yaml")
    ypath = tmp_path / "wf.yaml"
    ypath.write_text(yaml.safe_dump(wf.to_dict()))
    assert Workflow.from_file(ypath) == wf


def test_bad_files_name_the_problem(tmp_path: Path) -> None:
    with pytest.raises(WorkflowError, match="cannot read"):
        Workflow.from_file(tmp_path / "missing.json")
    bad = tmp_path / "bad.json"
    bad.write_text("{not json")
    with pytest.raises(WorkflowError, match="not valid JSON"):
        Workflow.from_file(bad)
    bad.write_text(json.dumps({"components": [{"name": "a"}]}))
    with pytest.raises(WorkflowError, match="global_batch"):
        Workflow.from_file(bad)
    bad.write_text(json.dumps({"global_batch": 4, "components": [{"name": "a", "gpus": 2}]}))
    with pytest.raises(WorkflowError, match="unknown key"):
        Workflow.from_file(bad)
