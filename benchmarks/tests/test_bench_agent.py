"""bench_agent runs end to end on a tiny setting, with the sandboxed code tool, and ends
with its JSON line (no timing is checked: the machine is shared)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

BENCH = Path(__file__).resolve().parents[1] / "bench_agent.py"


def test_bench_agent_prints_both_contenders_and_the_ratio() -> None:
    proc = subprocess.run([sys.executable, str(BENCH), "--skip-flow", "--rounds", "1",
                           "--trajectories", "4", "--tool", "python", "--max-load", "1000"],
                          capture_output=True, text=True, timeout=600, check=False)
    assert proc.returncode == 0, proc.stderr[-3000:]
    result = json.loads(proc.stdout.strip().splitlines()[-1])
    assert result["speedup_vs_sequential_loop"] > 0
    assert result["max_prediction_error"] is None and result["flow"] is None
    names = [c["name"] for c in result["contenders"]]
    assert names == ["rlinf tool loop", "sequential loop"]
    for contender in result["contenders"]:
        assert contender["trajectories_per_s"] > 0 and contender["cpu_s_per_trajectory"] > 0
        assert contender["tool_calls_per_s"] > 0  # the warm start calls, the sandbox answers
    assert result["setting"]["tool"] == "python"
