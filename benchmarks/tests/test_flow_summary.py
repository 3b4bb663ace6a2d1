"""The arithmetic behind bench_flow's verdict (no torch, no Ray)."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from flow_summary import FlowRun, format_table, summarize


def _run(setting: str, mode: str, measured: float, predicted: float | None = None, *,
         lock: float | None = 0.0, simulated: float | None = 0.0,
         app: str = "reasoning") -> FlowRun:
    return FlowRun(app, setting, mode, measured=measured, predicted=predicted,
                   lock_switches=lock, simulated_switches=simulated)


def test_from_summary_reads_the_four_keys_and_drops_non_finite_values():
    run = FlowRun.from_summary("embodied", "s", "auto", {
        "measured_iteration_s": 2.0, "predicted_iteration_s": float("nan"),
        "lock_switches_per_iteration": 2.0, "simulated_switches": 0, "placement": "env: 0"})
    assert (run.measured, run.predicted, run.lock_switches, run.simulated_switches) == (
        2.0, None, 2.0, 0.0)
    assert run.prediction_error is None and not run.switches_match


def test_verdict_takes_the_worst_setting_and_the_worst_prediction():
    runs = [
        _run("a", "collocated", 1.0, 1.1), _run("a", "hybrid", 0.8, 0.8),
        _run("a", "disaggregated", 0.9, 0.9), _run("a", "auto", 0.84, 0.8),
        _run("b", "collocated", 2.0, 1.0), _run("b", "auto", 2.0, 2.0),
    ]
    verdict = summarize(runs, load_average={"start": 1.0, "end": 2.0})
    assert verdict["auto_vs_best_fixed"] == pytest.approx(1.05)
    assert verdict["auto_vs_best_fixed_per_setting"] == {
        "reasoning/a": pytest.approx(1.05), "reasoning/b": pytest.approx(1.0)}
    assert verdict["max_prediction_error"] == pytest.approx(0.5)
    assert verdict["worst_prediction"] == "reasoning/b/collocated"
    assert verdict["lock_matches_simulator"] is True
    assert (verdict["runs"], verdict["failed"], verdict["predicted"], verdict["settings"]) == (
        6, 0, 6, 2)


def test_a_switch_mismatch_or_a_missing_count_fails_the_match_failed_runs_do_not():
    runs = [_run("a", "collocated", 1.0, lock=2.0, simulated=0.0),
            _run("a", "hybrid", 1.0, lock=None),
            FlowRun("reasoning", "a", "auto", error="exit 1: boom")]
    verdict = summarize(runs, load_average={})
    assert verdict["lock_matches_simulator"] is False
    assert verdict["switch_mismatches"] == ["reasoning/a/collocated", "reasoning/a/hybrid"]
    assert verdict["auto_vs_best_fixed"] is None and verdict["failed"] == 1


def test_table_has_one_row_per_run_and_names_failures():
    table = format_table([_run("a", "auto", 0.5, 0.45),
                          FlowRun("embodied", "b", "hybrid", error="exit 1: boom")])
    lines = table.splitlines()
    assert len(lines) == 4 and "pred s/it" in lines[0]
    assert "0.450" in lines[2] and "0.500" in lines[2] and "10.0%" in lines[2]
    assert "FAILED: exit 1: boom" in lines[3]
