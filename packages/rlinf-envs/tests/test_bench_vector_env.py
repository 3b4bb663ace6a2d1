"""The vector-env benchmark runs end to end on a tiny setting and refuses a busy machine."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path
from types import ModuleType

import pytest

BENCH = Path(__file__).resolve().parents[1] / "benchmarks" / "bench_vector_env.py"


def _bench() -> ModuleType:
    spec = importlib.util.spec_from_file_location("bench_vector_env", BENCH)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_prints_every_contender_and_one_json_line(capsys: pytest.CaptureFixture[str]) -> None:
    code = _bench().main(["--env", "InvertedPendulum-v5", "--num-envs", "3", "--steps", "30",
                          "--rounds", "1", "--threads", "2", "--max-load", "1000"])
    assert code == 0
    lines = capsys.readouterr().out.strip().splitlines()
    summary = json.loads(lines[-1])
    rates = summary["steps_per_s"]
    assert {"gymnasium SyncVectorEnv", "rlinf loop", "rlinf batched, 1 thr",
            "rlinf batched, 2 thr"} <= set(rates)
    assert all(rate > 0 for rate in rates.values())
    assert summary["batched_speedup_vs_gymnasium"] > 0


def test_a_busy_machine_is_refused(capsys: pytest.CaptureFixture[str]) -> None:
    assert _bench().main(["--max-load", "-1"]) == 3
    assert "refused: load average" in capsys.readouterr().err
