"""bench_link runs end to end on a tiny setting and ends with its JSON line (no timing is
checked: the machine is shared)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

BENCH = Path(__file__).resolve().parents[1] / "bench_link.py"


def test_bench_link_prints_every_contender_and_the_ratios() -> None:
    proc = subprocess.run([sys.executable, str(BENCH), "--steps", "60", "--rounds", "1",
                           "--spin-us", "5"], capture_output=True, text=True, timeout=300,
                          check=False)
    assert proc.returncode == 0, proc.stderr
    result = json.loads(proc.stdout.strip().splitlines()[-1])
    for name in ("ring_spin5", "endpoint", "mp_pipe"):
        assert result[f"{name}_rtt_us"] > 0 and result[f"{name}_cpu_s_per_1k"] >= 0
    assert result["best_ring"] == "ring_spin5"
    assert result["ring_speedup_vs_endpoint"] > 0 and result["ring_speedup_vs_mp_pipe"] > 0
