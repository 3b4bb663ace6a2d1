"""``rlinf-reasoning task=math_tools``: GRPO with the calculator between turns, through the
CLI, from the shipped tool-calling warm start; it reports the tools' use before and after."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from .test_run import read_jsonl, run_cli

pytestmark = pytest.mark.timeout(600)


def test_a_tool_loop_run_trains_and_reports_tool_use(tmp_path: Path, ray_address: str) -> None:
    run = tmp_path / "run"
    proc = run_cli(run, "task=math_tools", "rollout.max_new_tokens=32", "run.eval_every=2",
                   "run.steps=2", "run.predict=false",
                   "data.prompts_per_step=16", "data.heldout_size=32",
                   ray_address=ray_address)
    assert "tool calls          " in proc.stdout and " per answer, error rate " in proc.stdout
    records = read_jsonl(run / "metrics.jsonl")
    steps = [r for r in records if "rollout/tool_calls_per_response" in r]
    assert len(steps) == 2
    for r in steps:
        assert r["rollout/turns"] > 1 and r["rollout/tool_tokens_per_response"] > 0, r
        assert 0 <= r["rollout/tool_error_rate"] <= 1, r
    assert all(r["actor/grad_norm"] > 0 for r in steps)
    evaluations = [r for r in records if "eval/tool_calls_per_answer" in r]
    assert [r["step"] for r in evaluations] == [0, 2]
    summary = json.loads((run / "summary.json").read_text())
    assert summary["tools_before"]["calls_per_answer"] > 0.5
    assert set(summary["tools_after"]) == {"calls_per_answer", "error_rate"}
    config = json.loads((run / "config.json").read_text())
    assert config["config"]["tools.names"] == ["calculator"]
    assert "task=math_tools" in config["overrides"]


@pytest.mark.parametrize("tool", ["search", "no_such_module:lookup"])
def test_an_unknown_tool_is_refused_before_any_worker_starts(tmp_path: Path, tool: str) -> None:
    import subprocess
    import sys

    proc = subprocess.run([sys.executable, "-m", "rlinf_reasoning.cli", f"tools.names=[{tool}]",
                           f"run.run_dir={tmp_path / 'run'}"], capture_output=True, text=True,
                          timeout=120, check=False)
    assert proc.returncode == 2, proc.stderr[-2000:]
    assert "tools.names" in proc.stderr and tool in proc.stderr
    assert "Traceback" not in proc.stderr
