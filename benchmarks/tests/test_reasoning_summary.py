"""The arithmetic behind bench_reasoning's verdict (no torch, no Ray)."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from reasoning_summary import RunResult, check_bounds, format_table, merge_rounds, summarize


def _run(name: str, system: str, engine: str, seconds: list[float], *, samples: int = 512,
         predicted: float | None = None) -> RunResult:
    return RunResult(name=name, system=system, engine=engine, seconds=seconds,
                     samples=[samples] * len(seconds), tokens=[samples * 10] * len(seconds),
                     predicted=predicted)


def test_medians_are_per_iteration_rates():
    run = RunResult(name="r", system="rlinf", engine="hf", seconds=[1.0, 4.0, 2.0],
                    samples=[100, 100, 100], tokens=[1000, 2000, 500])
    assert run.seconds_per_iteration == 2.0
    assert run.samples_per_s == 50.0  # median of 100, 25, 50
    assert run.tokens_per_s == 500.0  # median of 1000, 500, 250


def test_speedups_pick_the_best_run_overall_and_with_hf():
    results = [
        _run("trl", "trl", "hf", [2.0]),                                   # 256 samples/s
        _run("colloc", "rlinf", "hf", [1.6], predicted=2.0),                # 320 -> 1.25x
        _run("disagg", "rlinf", "hf", [2.5], predicted=2.5),                # 204.8
        _run("vllm", "rlinf", "vllm", [1.0], predicted=0.9),                # 512 -> 2x
    ]
    verdict = summarize(results)
    assert verdict["speedup_vs_trl"] == pytest.approx(2.0)
    assert verdict["speedup_vs_trl_hf"] == pytest.approx(1.25)
    assert verdict["max_prediction_error"] == pytest.approx(0.25)  # |2.0 - 1.6| / 1.6
    assert (verdict["best"], verdict["best_hf"]) == ("vllm", "colloc")


def test_the_baseline_is_the_fastest_trl_setting():
    results = [_run("trl 2 threads", "trl", "hf", [4.0]), _run("trl 1 thread", "trl", "hf", [2.0]),
               _run("colloc", "rlinf", "hf", [1.0])]
    verdict = summarize(results)
    assert verdict["trl_samples_per_s"] == pytest.approx(256.0)
    assert verdict["speedup_vs_trl_hf"] == pytest.approx(2.0)


def test_missing_sides_give_none_not_a_number():
    only_ours = summarize([_run("colloc", "rlinf", "hf", [1.0])])
    assert only_ours["speedup_vs_trl"] is None and only_ours["max_prediction_error"] is None
    only_trl = summarize([_run("trl", "trl", "hf", [1.0])])
    assert only_trl["speedup_vs_trl_hf"] is None


def test_bad_runs_are_rejected():
    with pytest.raises(ValueError, match="timed iterations"):
        RunResult(name="r", system="trl", engine="hf", seconds=[], samples=[], tokens=[])
    with pytest.raises(ValueError, match="> 0"):
        _run("r", "trl", "hf", [0.0])


def test_table_has_one_row_per_run_and_marks_missing_predictions():
    table = format_table([_run("trl", "trl", "hf", [2.0]),
                          _run("colloc", "rlinf", "hf", [1.6], predicted=2.0)])
    lines = table.splitlines()
    assert len(lines) == 4 and "cpu s/smp" in lines[0]
    assert lines[2].split()[-3:] == ["-", "-", "-"]  # no CPU times, prediction or error
    assert "25.0%" in lines[3]


def test_rounds_pool_their_iterations_and_cpu_seconds_are_per_sample():
    one = RunResult(name="r", system="rlinf", engine="hf", seconds=[1.0, 3.0],
                    samples=[100, 100], tokens=[1, 1], cpu_seconds=[2.0, 5.0])
    two = RunResult(name="r", system="rlinf", engine="hf", seconds=[2.0, 4.0],
                    samples=[100, 100], tokens=[1, 1], cpu_seconds=[3.0, 4.0], predicted=2.5)
    other = _run("t", "trl", "hf", [1.0])
    merged = merge_rounds([one, other, two])
    assert [m.name for m in merged] == ["r", "t"]
    pooled = merged[0]
    assert pooled.rounds == 2 and list(pooled.seconds) == [1.0, 3.0, 2.0, 4.0]
    assert pooled.seconds_per_iteration == 2.5 and pooled.predicted == 2.5
    assert pooled.cpu_seconds_per_sample == pytest.approx(0.035)  # median of .02 .05 .03 .04
    with pytest.raises(ValueError, match="some rounds only"):
        merge_rounds([one, _run("r", "rlinf", "hf", [1.0])])
    with pytest.raises(ValueError, match="CPU times"):
        RunResult(name="r", system="trl", engine="hf", seconds=[1.0], samples=[1], tokens=[1],
                  cpu_seconds=[1.0, 2.0])


def test_bounds_are_checked_and_a_missing_figure_is_unknown():
    verdict = summarize([_run("trl", "trl", "hf", [2.0]),
                         _run("colloc", "rlinf", "hf", [1.6], predicted=1.7),
                         _run("vllm", "rlinf", "vllm", [1.0], predicted=1.0)])
    # 2.0x and 1.25x against TRL; prediction errors 6.25% and 0
    assert verdict["bounds_met"] == {"speedup_vs_trl": True, "speedup_vs_trl_hf": True,
                                     "max_prediction_error": True}
    assert check_bounds({"speedup_vs_trl": 1.4, "speedup_vs_trl_hf": None,
                         "max_prediction_error": 0.2}) == {
        "speedup_vs_trl": False, "speedup_vs_trl_hf": None, "max_prediction_error": False}
