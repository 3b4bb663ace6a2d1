"""rlinf-plan end to end in a subprocess, and its errors on bad input."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from rlinf.sched.analytic_costs import AnalyticCost, AnalyticCostModel
from rlinf.sched.cli import main
from rlinf.sched.cluster import Cluster
from rlinf.sched.execution_plan import PlanResult
from rlinf.sched.workflow import Component, Edge, Loop, Workflow


def write_inputs(tmp_path: Path) -> tuple[Path, Path, Path]:
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
    paths = (tmp_path / "wf.json", tmp_path / "costs.json", tmp_path / "cluster.json")
    paths[0].write_text(json.dumps(wf.to_dict()))
    paths[1].write_text(json.dumps(cost.to_dict()))
    Cluster.uniform(1, 4, 100, "H100").to_file(paths[2])
    return paths


def test_cli_end_to_end_writes_plan_and_gantt(tmp_path: Path) -> None:
    wf, costs, cl = write_inputs(tmp_path)
    out, png = tmp_path / "plan.json", tmp_path / "plan.png"
    proc = subprocess.run(
        [sys.executable, "-m", "rlinf.sched.cli", str(wf), str(costs), str(cl),
         "--out", str(out), "--gantt", str(png), "--top", "3", "--max-chunks", "4"],
        capture_output=True, text=True, timeout=120, check=False)
    assert proc.returncode == 0, proc.stderr
    assert "tiny-embodied: 3 components on 4 devices" in proc.stdout
    assert "(best collocated)" in proc.stdout and "(best disaggregated)" in proc.stdout
    result = PlanResult.load(out)
    assert 1 <= len(result.ranked) <= 3
    assert result.best.predicted_time <= min(p.predicted_time for p in result.baselines.values())
    assert result.best.spec in proc.stdout
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert png.stat().st_size > 5_000


@pytest.mark.parametrize(
    ("which", "content", "message"),
    [
        ("workflow", "{broken", "not valid JSON"),
        ("workflow", json.dumps({"global_batch": 4, "components": [{"name": "x"}],
                                 "edges": [{"src": "x", "dst": "y"}]}), "unknown component"),
        ("costs", json.dumps({"format": "nope"}), "format 'nope'"),
        ("costs", json.dumps({"format": "rlinf-analytic-costs/1",
                              "components": {"env": {"per_item": -1}}}), ">= 0"),
        ("cluster", json.dumps({"nodes": "many"}), "'nodes' list"),
    ],
)
def test_cli_reports_bad_files(tmp_path: Path, capsys: pytest.CaptureFixture[str],
                               which: str, content: str, message: str) -> None:
    wf, costs, cl = write_inputs(tmp_path)
    target = {"workflow": wf, "costs": costs, "cluster": cl}[which]
    target.write_text(content)
    code = main([str(wf), str(costs), str(cl), "--out", str(tmp_path / "p.json"),
                 "--gantt", ""])
    err = capsys.readouterr().err
    assert code == 2
    assert err.startswith("rlinf-plan: error:")
    assert message in err


def test_cli_missing_file_and_unknown_component_cost(tmp_path: Path,
                                                     capsys: pytest.CaptureFixture[str]) -> None:
    wf, costs, cl = write_inputs(tmp_path)
    assert main([str(tmp_path / "nope.json"), str(costs), str(cl)]) == 2
    assert "cannot read workflow file" in capsys.readouterr().err
    costs.write_text(json.dumps({"format": "rlinf-analytic-costs/1",
                                 "components": {"env": {"per_item": 1.0}}}))
    assert main([str(wf), str(costs), str(cl), "--gantt", ""]) == 2
    assert "no cost for component" in capsys.readouterr().err
