"""Workflow graph: validation, dependency order, loops, files."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

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


def test_a_lagged_edge_feeds_a_component_outside_loops() -> None:
    loop = (Loop(("a", "b"), 2),)
    parts = (Component("a"), Component("b"), Component("c"))
    with pytest.raises(WorkflowError, match="lagged edge c->a"):
        Workflow(parts, (Edge("c", "a", lagged=True), Edge("a", "b"),
                         Edge("b", "a", feedback=True)), loops=loop)
    with pytest.raises(WorkflowError, match="lagged edge b->a"):
        Workflow(parts, (Edge("a", "b"), Edge("b", "a", feedback=True, lagged=True)),
                 loops=loop)


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
        ({"micro_batch_multiple": 0}, "micro_batch_multiple"),
        ({"batch": 10, "micro_batch_multiple": 4}, "not a multiple of micro_batch_multiple"),
        ({"micro_batch_divides": 1}, "micro_batch_divides"),
        ({"same_micro_batch_as": "x"}, "another component"),
        ({"streaming": True, "same_micro_batch_as": "y"}, "streaming"),
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


@pytest.mark.parametrize(
    ("components", "match"),
    [
        ((Component("a", micro_batch_multiple=3),), "'a' has batch 8, not a multiple"),
        ((Component("a", same_micro_batch_as="z"),), "'a' has same_micro_batch_as='z', an "
                                                     "unknown"),
        ((Component("a", streaming=True), Component("b", same_micro_batch_as="a")),
         "itself follows another or streams"),
        ((Component("a", batch=4), Component("b", same_micro_batch_as="a")),
         r"'b' \(batch 8\) takes the micro-batch of 'a' \(batch 4\)"),
    ],
)
def test_micro_batch_rules_across_components(components: tuple[Component, ...],
                                             match: str) -> None:
    with pytest.raises(WorkflowError, match=match):
        Workflow(components, global_batch=8)


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
    declared = Workflow(
        (Component("env", micro_batch_divides=True, split_evenly=True),
         Component("rollout", micro_batch_multiple=2, same_micro_batch_as="env",
                   devices_divide="env"),
         Component("actor", batch=40, whole_batch=True)),
        (Edge("env", "rollout"), Edge("rollout", "env", feedback=True),
         Edge("rollout", "actor", lagged=True)), global_batch=8,
        loops=(Loop(("env", "rollout"), 5),))
    path.write_text(json.dumps(declared.to_dict()))
    assert Workflow.from_file(path) == declared
    assert "whole_batch" not in json.dumps(wf.to_dict())  # defaults are not written
    with pytest.raises(WorkflowError, match="devices_divide='critic', an unknown component"):
        Workflow((Component("a", devices_divide="critic"),), (), global_batch=4)
    with pytest.raises(WorkflowError, match="devices_divide='a'"):
        Component("a", devices_divide="a")
    with pytest.raises(WorkflowError, match="split_evenly"):
        Component("a", split_evenly="yes")  # type: ignore[arg-type]
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
    bad.write_text(json.dumps({"global_batch": 4,
                               "components": [{"name": "a", "whole_batch": "yes"}]}))
    with pytest.raises(WorkflowError, match=r"components\[0\]\.whole_batch is 'yes': "
                                            "expected true or false"):
        Workflow.from_file(bad)


def _set(*path: str | int, value: object) -> Callable[[dict[str, Any]], None]:
    """A change that sets document[path...] = value (deletes it for `MISSING`)."""

    def change(document: dict[str, Any]) -> None:
        target: Any = document
        for key in path[:-1]:
            target = target[key]
        if value is MISSING:
            del target[path[-1]]
        else:
            target[path[-1]] = value

    return change


MISSING = object()
NAN, INF = float("nan"), float("inf")


@pytest.mark.parametrize(
    ("path", "value", "key", "expected"),
    [
        (("global_batch",), 12.5, "global_batch is 12.5", "expected an integer >= 1"),
        (("global_batch",), True, "global_batch is True", "expected an integer >= 1"),
        (("global_batch",), 0, "global_batch is 0", "expected an integer >= 1"),
        (("global_batch",), -8, "global_batch is -8", "expected an integer >= 1"),
        (("global_batch",), "many", "global_batch is 'many'", "expected an integer >= 1"),
        (("global_batch",), MISSING, "'global_batch'", "expected an integer >= 1"),
        (("components", 1, "batch"), 0, "components[1].batch is 0", "integer >= 1"),
        (("components", 1, "batch"), 2.5, "components[1].batch is 2.5", "integer >= 1"),
        (("components", 1, "batch"), True, "components[1].batch is True", "integer >= 1"),
        (("components", 2, "device_multiple"), 0, "components[2].device_multiple is 0",
         "integer >= 1"),
        (("components", 0, "min_devices"), -1, "components[0].min_devices is -1",
         "integer >= 1"),
        (("components", 0, "max_devices"), 0.5, "components[0].max_devices is 0.5",
         "integer >= 1"),
        (("components", 0, "streaming"), "false", "components[0].streaming is 'false'",
         "expected true or false"),
        (("components", 1, "completion"), [[NAN, 1.0]], "components[1].completion[0]",
         "pair in [0, 1]"),
        (("components", 1, "completion"), [[0.5, INF], [1, 1]],
         "components[1].completion[0]", "pair in [0, 1]"),
        (("edges", 0, "bytes_per_item"), -1, "edges[0].bytes_per_item is -1",
         "finite number >= 0"),
        (("edges", 0, "bytes_per_item"), NAN, "edges[0].bytes_per_item is nan",
         "finite number >= 0"),
        (("edges", 2, "bytes_per_item"), INF, "edges[2].bytes_per_item is inf",
         "finite number >= 0"),
        (("edges", 2, "bytes_per_item"), True, "edges[2].bytes_per_item is True",
         "finite number >= 0"),
        (("edges", 0, "items"), 0, "edges[0].items is 0", "integer >= 1"),
        (("edges", 0, "items"), 1.5, "edges[0].items is 1.5", "integer >= 1"),
        (("edges", 1, "feedback"), "yes", "edges[1].feedback is 'yes'", "true or false"),
        (("loops", 0, "steps"), 0, "loops[0].steps is 0", "integer >= 1"),
        (("loops", 0, "steps"), 2.5, "loops[0].steps is 2.5", "integer >= 1"),
    ],
)
def test_bad_values_in_a_workflow_file_are_refused_by_rlinf_plan(
    run_with_bad: Any, assert_refused: Any, path: tuple[str | int, ...], value: object,
    key: str, expected: str,
) -> None:
    assert_refused(run_with_bad("workflow", _set(*path, value=value)), key, expected)


def test_integral_floats_and_numeric_strings_are_read() -> None:
    # JSON writers that only know floats, and PyYAML reading 1e6 as a string.
    data = embodied().to_dict()
    data["global_batch"] = 8.0
    data["edges"][0]["bytes_per_item"] = "1e6"
    data["loops"][0]["steps"] = "5"
    wf = Workflow.from_dict(data)
    assert wf.global_batch == 8 and wf.edges[0].bytes_per_item == 1e6 and wf.loops[0].steps == 5


def test_constructors_refuse_fractional_and_non_finite_values() -> None:
    with pytest.raises(WorkflowError, match=r"global_batch=12\.5"):
        Workflow((Component("a"),), global_batch=12.5)  # type: ignore[arg-type]
    with pytest.raises(WorkflowError, match=r"batch=2\.5"):
        Component("a", batch=2.5)  # type: ignore[arg-type]
    with pytest.raises(WorkflowError, match="bytes_per_item=nan"):
        Workflow((Component("a"), Component("b")), (Edge("a", "b", bytes_per_item=NAN),))
    with pytest.raises(WorkflowError, match="expected components and steps >= 1"):
        Workflow((Component("a"),), loops=(Loop(("a",), 1.5),))  # type: ignore[arg-type]


def test_a_staircase_completion_finishes_items_in_equal_batches() -> None:
    from rlinf.sched import staircase_completion

    two = Component("rollout", streaming=True, completion=staircase_completion(2))
    assert two.time_fraction(0.25) == pytest.approx(0.5)
    assert two.time_fraction(0.5) == pytest.approx(0.5)
    assert two.time_fraction(0.75) == pytest.approx(1.0)
    one = Component("rollout", streaming=True, completion=staircase_completion(1))
    assert one.time_fraction(0.1) == pytest.approx(1.0)  # all at the end
