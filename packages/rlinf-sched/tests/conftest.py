"""Shared fixtures: the three input files of ``rlinf-plan`` and a way to run it on a bad one."""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from rlinf.sched.analytic_costs import AnalyticCost, AnalyticCostModel
from rlinf.sched.cli import main
from rlinf.sched.cluster import Cluster
from rlinf.sched.workflow import Component, Edge, Loop, Workflow


@dataclass(frozen=True)
class PlanInputs:
    """A workflow, an analytic cost file and a cluster file that plan on 4 devices."""

    workflow: Path
    costs: Path
    cluster: Path
    out: Path
    """Where the plan document goes."""

    def args(self, *extra: str) -> list[str]:
        return [str(self.workflow), str(self.costs), str(self.cluster), "--out", str(self.out),
                *extra]


@pytest.fixture
def plan_inputs(tmp_path: Path) -> PlanInputs:
    wf = Workflow(
        (Component("env"), Component("rollout"), Component("actor")),
        (Edge("env", "rollout", bytes_per_item=1e6), Edge("rollout", "env", feedback=True),
         Edge("rollout", "actor", bytes_per_item=1e7)),
        global_batch=16, loops=(Loop(("env", "rollout"), 3),), name="tiny-embodied")
    cost = AnalyticCostModel({
        "env": AnalyticCost(fixed=0.01, per_item=0.05, replicated=50, switch=1.0),
        "rollout": AnalyticCost(fixed=0.01, per_item=0.05, replicated=40, switch=1.0),
        "actor": AnalyticCost(fixed=0.1, per_item=0.5, replicated=40, switch=2.0),
    })
    inputs = PlanInputs(tmp_path / "wf.json", tmp_path / "costs.json",
                        tmp_path / "cluster.json", tmp_path / "plan.json")
    inputs.workflow.write_text(json.dumps(wf.to_dict()))
    inputs.costs.write_text(json.dumps(cost.to_dict()))
    Cluster.uniform(1, 4, 100, "H100").to_file(inputs.cluster)
    return inputs


RunBad = Callable[[str, Callable[[dict[str, Any]], object]], tuple[int, str, Path]]


@pytest.fixture
def run_with_bad(plan_inputs: PlanInputs, capsys: pytest.CaptureFixture[str]) -> RunBad:
    """``run_with_bad(which, change)``: apply `change` to the document of file `which`
    (``workflow``, ``costs`` or ``cluster``), run ``rlinf-plan`` in this process, and return
    its exit code, its stderr and the changed file. An uncaught exception fails the test."""

    def run(which: str, change: Callable[[dict[str, Any]], object]) -> tuple[int, str, Path]:
        path = getattr(plan_inputs, which)
        document = json.loads(path.read_text())
        change(document)
        path.write_text(json.dumps(document))  # NaN and Infinity as JSON's usual extension
        capsys.readouterr()
        code = main(plan_inputs.args("--gantt", ""))
        return code, capsys.readouterr().err, path

    return run


def _assert_refused(result: tuple[int, str, Path], key: str, expected: str = "expected") -> None:
    code, err, path = result
    assert code == 2, err
    assert err.startswith("rlinf-plan: error:") and err.count("\n") == 1, err
    assert repr(str(path)) in err, err
    assert key in err and expected in err, err
    assert "Traceback" not in err


@pytest.fixture
def assert_refused() -> Callable[..., None]:
    """``assert_refused(run_with_bad(...), key, expected)``: exit status 2 and one line on
    stderr that names the file, the key inside it and what was expected."""
    return _assert_refused
