"""The printed summary and the threshold check."""

from __future__ import annotations

import json

import pytest
from rlinf_embodied.summary import RunSummary, target_reached


@pytest.mark.parametrize(("ret", "success", "t_ret", "t_success", "expected"), [
    (600.0, None, 500.0, None, True),
    (499.9, None, 500.0, None, False),
    (10.0, 0.6, None, 0.5, True),
    (10.0, 0.4, None, 0.5, False),
    (10.0, None, None, 0.5, False),  # a success threshold needs a success signal
    (600.0, 0.4, 500.0, 0.5, False),  # both must hold
    (1.0, None, None, None, None),  # no threshold: no verdict
])
def test_target_reached(ret, success, t_ret, t_success, expected):
    assert target_reached(mean_return=ret, success_rate=success, target_return=t_ret,
                          target_success_rate=t_success) is expected


def _summary(**changes: object) -> RunSummary:
    fields: dict[str, object] = dict(
        task="gym:InvertedDoublePendulum-v5", algorithm="ppo", mode="hybrid",
        placement="env: 0, rollout: 1, actor: 0-1", steps=70, eval_return_before=85.5,
        eval_return_after=9325.2, success_before=None, success_after=None,
        target_return=5000.0, target_success_rate=None, target_reached=True,
        wall_seconds=182.3, total_seconds=190.0, env_steps=143360, env_steps_per_s=786.4,
        measured_iteration_s=2.122, predicted_iteration_s=1.5, run_dir="/tmp/r")
    fields.update(changes)
    return RunSummary(**fields)  # type: ignore[arg-type]


def test_format_shows_before_after_threshold_and_mode():
    text = _summary().format()
    assert "evaluation return   85.5 -> 9325.2" in text
    assert "threshold           return >= 5000: REACHED" in text
    assert "success rate        n/a -> n/a" in text
    assert "143360 (786 steps/s)" in text
    assert "2.122 s median (predicted 1.500 s)" in text
    assert "iterations          70 in 182.3 s of training" in text
    assert "mode                hybrid: env: 0, rollout: 1, actor: 0-1" in text
    assert "context switches    n/a per iteration by the device lock (n/a simulated)" in text
    switches = _summary(lock_switches_per_iteration=2.0, simulated_switches=0).format()
    assert "context switches    2 per iteration by the device lock (0 simulated)" in switches
    missed = _summary(target_reached=False, target_success_rate=0.5, success_before=0.0,
                      success_after=0.25).format()
    assert "return >= 5000 and success rate >= 0.5: NOT reached" in missed
    assert "success rate        0.00 -> 0.25" in missed


def test_save_round_trips(tmp_path):
    summary = _summary()
    path = summary.save(tmp_path)
    assert RunSummary(**json.loads(path.read_text())) == summary
