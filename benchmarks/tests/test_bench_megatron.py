"""bench_megatron's flags and summary (the timing itself is not tested)."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from bench_megatron import parse_args, summarize


def test_cuts_that_cannot_span_every_rank_are_refused() -> None:
    with pytest.raises(SystemExit):
        parse_args(["--ranks", "3"])  # 3 does not divide 4 layers
    with pytest.raises(SystemExit):
        parse_args(["--contenders", "fsdp2,megatron-xx"])
    _, setting = parse_args(["--layers", "6", "--ranks", "2", "--hidden", "64"])
    assert setting.layers == 6 and setting.hidden == 64


def test_a_step_lasts_as_long_as_its_slowest_rank_and_costs_every_ranks_cpu() -> None:
    records = [{"round": 0, "contender": "fsdp2", "rank": r, "seconds": [1.0 + r, 2.0],
                "cpu_seconds": [0.5, 0.5], "optimizer_bytes": (r + 1) << 20} for r in range(2)]
    row = summarize(records, ["fsdp2"])["fsdp2"]
    assert row["median_step_s"] == 2.0  # steps took max(1, 2) = 2 and max(2, 2) = 2
    assert row["cpu_s_per_step"] == 1.0
    assert row["samples"] == 2
    assert row["optimizer_mb_per_rank"] == 2.0  # the rank holding the most
