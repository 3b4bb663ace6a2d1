"""The arithmetic of bench_libero's verdict (no LIBERO, no Ray)."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench_libero import verdict
from flow_summary import FlowRun


def _env(rate: float, cpu: float = 100.0) -> dict[str, float]:
    return {"env_steps_per_s": rate, "cpu_s_per_1000_steps": cpu}


def test_env_ratios_use_the_best_rlinf_process_count():
    result = verdict({"rlinf x1": _env(6.0), "rlinf x2": _env(11.0),
                      "LIBERO SubprocVectorEnv": _env(5.0), "LIBERO DummyVectorEnv": _env(5.5)},
                     [])
    assert result["process_speedup"] == pytest.approx(11 / 6, abs=1e-3)
    assert result["speedup_vs_libero_subproc"] == pytest.approx(2.2)
    assert result["speedup_vs_libero_dummy"] == pytest.approx(2.0)
    assert "auto_vs_best_fixed" not in result and result["hybrid_vs_collocated"] == {}


def test_app_ratios_take_each_modes_median_run_with_its_own_prediction():
    runs = [FlowRun("embodied", "p1", "collocated", measured=m, predicted=m)
            for m in (10.0, 12.0, 30.0)]
    runs += [FlowRun("embodied", "p1", "hybrid", measured=8.0, predicted=6.0),
             FlowRun("embodied", "p1", "auto", measured=9.0, predicted=9.0,
                     placement="env,rollout,actor: 0"),
             FlowRun("embodied", "p2", "hybrid", error="exit 1: boom")]
    result = verdict({"rlinf x1": _env(6.0)}, runs)
    assert result["hybrid_vs_collocated"] == {"p1": pytest.approx(1.5)}  # median 12 over 8
    assert result["auto_vs_best_fixed"] == pytest.approx(9 / 8, abs=1e-3)
    assert result["auto_choice"] == {"p1": "env,rollout,actor: 0"}
    assert result["max_prediction_error"] == pytest.approx(0.25)  # hybrid: |6 - 8| / 8


def test_concurrent_groups_are_compared_with_turns_per_placement():
    runs = [FlowRun("embodied", "p2", "collocated", measured=10.0, predicted=10.0),
            FlowRun("embodied", "p2-turns", "collocated", measured=12.0, predicted=12.0),
            FlowRun("embodied", "p2", "hybrid", measured=8.0, predicted=8.0),
            FlowRun("embodied", "p2-turns", "hybrid", error="exit 1: boom")]
    result = verdict({}, runs)
    assert result["concurrent_vs_turns"] == {"p2/collocated": pytest.approx(1.2)}
