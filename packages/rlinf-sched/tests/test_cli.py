"""rlinf-plan end to end in a subprocess, and its errors on bad input."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import TYPE_CHECKING

import pytest

from rlinf.sched.cli import main
from rlinf.sched.execution_plan import PlanResult

if TYPE_CHECKING:
    from conftest import PlanInputs  # the fixture's type (tests/conftest.py)


def test_cli_end_to_end_writes_plan_and_gantt(tmp_path: Path, plan_inputs: PlanInputs) -> None:
    out, png = plan_inputs.out, tmp_path / "plan.png"
    proc = subprocess.run(
        [sys.executable, "-m", "rlinf.sched.cli",
         *plan_inputs.args("--gantt", str(png), "--top", "3", "--max-chunks", "4")],
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
def test_cli_reports_bad_files(plan_inputs: PlanInputs, capsys: pytest.CaptureFixture[str],
                               which: str, content: str, message: str) -> None:
    getattr(plan_inputs, which).write_text(content)
    code = main(plan_inputs.args("--gantt", ""))
    err = capsys.readouterr().err
    assert code == 2
    assert err.startswith("rlinf-plan: error:")
    assert message in err


def test_cli_missing_file_and_unknown_component_cost(
    tmp_path: Path, plan_inputs: PlanInputs, capsys: pytest.CaptureFixture[str]
) -> None:
    args = plan_inputs.args("--gantt", "")
    assert main([str(tmp_path / "nope.json"), *args[1:]]) == 2
    assert "cannot read workflow file" in capsys.readouterr().err
    plan_inputs.costs.write_text(json.dumps({"format": "rlinf-analytic-costs/1",
                                             "components": {"env": {"per_item": 1.0}}}))
    assert main(args) == 2
    assert "no cost for component" in capsys.readouterr().err


def test_empty_gantt_skips_the_chart(tmp_path: Path, plan_inputs: PlanInputs,
                                     monkeypatch: pytest.MonkeyPatch,
                                     capsys: pytest.CaptureFixture[str]) -> None:
    # Path("") is "." — the chart used to be drawn into the working directory (and without
    # matplotlib every run exited 2).
    monkeypatch.chdir(tmp_path)
    assert main(plan_inputs.args("--gantt", "")) == 0
    out = capsys.readouterr().out
    assert "plan written to" in out and "gantt chart written" not in out
    assert PlanResult.load(plan_inputs.out).ranked
    assert not list(tmp_path.rglob("*.png"))


def test_bad_value_exits_2_with_one_line_in_a_subprocess(plan_inputs: PlanInputs) -> None:
    # intra_node_bandwidth: 0 used to end in a ZeroDivisionError traceback.
    document = json.loads(plan_inputs.cluster.read_text())
    document["intra_node_bandwidth"] = 0
    plan_inputs.cluster.write_text(json.dumps(document))
    proc = subprocess.run([sys.executable, "-m", "rlinf.sched.cli",
                           *plan_inputs.args("--gantt", "")],
                          capture_output=True, text=True, timeout=120, check=False)
    assert proc.returncode == 2
    assert proc.stderr.splitlines() == [
        f"rlinf-plan: error: in cluster file {str(plan_inputs.cluster)!r}: "
        "intra_node_bandwidth is 0: expected a finite number > 0"]


def test_yaml_errors_are_one_line(plan_inputs: PlanInputs,
                                  capsys: pytest.CaptureFixture[str]) -> None:
    pytest.importorskip("yaml")
    bad = plan_inputs.workflow.with_suffix(".yaml")
    bad.write_text("global_batch: [1,\n  components: {\n")
    assert main([str(bad), *plan_inputs.args("--gantt", "")[1:]]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "not valid YAML" in err and repr(str(bad)) in err


def test_a_search_prints_where_it_stands_on_stderr(plan_inputs: PlanInputs,
                                                    capsys: pytest.CaptureFixture[str]) -> None:
    assert main(plan_inputs.args("--gantt", "", "--max-chunks", "4",
                                 "--progress-every", "0")) == 0
    lines = capsys.readouterr().err.splitlines()
    assert lines and all(line.startswith("planning (") for line in lines)
    assert "simulations in" in lines[-1] and "per iteration" in lines[-1]
    assert main(plan_inputs.args("--gantt", "", "--progress-every", "-1")) == 2
    assert "progress_every" in capsys.readouterr().err
