"""bench_comm's small-message contenders run end to end on a tiny setting and end with the
JSON line (no timing is checked: the machine is shared)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

BENCH = Path(__file__).resolve().parents[1] / "bench_comm.py"


def test_bench_comm_prints_the_small_message_ratios() -> None:
    proc = subprocess.run(
        [sys.executable, str(BENCH), "--skip-sizes", "--rounds", "2", "--small-pings", "40",
         "--small-messages", "40", "--small-bytes", "1024"],
        capture_output=True, text=True, timeout=300, check=False)
    assert proc.returncode == 0, proc.stderr
    result = json.loads(proc.stdout.strip().splitlines()[-1])
    for key in ("pipe_rtt_us_1KiB", "channel_rtt_us_1KiB", "channel_stream_mib_s_1KiB",
                "mp_queue_stream_mib_s_1KiB", "small_load_average_max"):
        assert result[key] > 0, key
    assert result["latency_ratio_vs_pipe_1KiB"] > 0 and result["ratio_vs_mp_queue_1KiB"] > 0
    for name in ("pipe_rtt", "channel_rtt", "channel_stream", "mpq_stream"):
        assert name in proc.stdout  # each contender's row, with its CPU-seconds
    assert "CPU" in proc.stdout and "load average" in proc.stdout
