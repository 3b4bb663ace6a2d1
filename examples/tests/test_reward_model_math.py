"""The reward-model example, for real, on CPU slots: its own component (`Judge`) trains
beside the library's roles in every placement mode and ``auto``, its score reaches the
policy's loss, the placement changes the schedule and not what is learned, and nothing is
left behind."""

from __future__ import annotations

import math
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from .conftest import leaving_nothing

EXAMPLE = Path(__file__).resolve().parents[1] / "reward_model_math.py"
sys.path.insert(0, str(EXAMPLE.parent))
import reward_model_math as example  # noqa: E402

FIXED = {  # mode: (placement, CPU slots)
    "collocated": ("rollout,reward,judge,actor: 0", 2),
    "hybrid": ("rollout: 0, reward,judge,actor: 1", 2),
    "disaggregated": ("rollout: 0, reward: 1, judge: 2, actor: 3", 4),
}
RESULTS: dict[str, dict[str, Any]] = {}


def run_example(cfg: example.Config) -> dict[str, Any]:
    summary = leaving_nothing(lambda: example.main(cfg))
    for key in ("reward/mean_reward", "judge/mean_score", "actor/policy_loss"):
        assert len(summary[key]) == 2 and all(math.isfinite(v) for v in summary[key]), key
    assert all(0 < abs(s) < 1 for s in summary["judge/mean_score"])  # tanh of a real score
    return summary


@pytest.mark.parametrize("mode", list(FIXED))
def test_every_fixed_placement_runs_the_users_component(backend: str, mode: str) -> None:
    placement, slots = FIXED[mode]
    summary = run_example(example.Config(placement=placement, cpu_slots=slots, timeout=120))
    assert summary["mode"] == mode
    assert all((holds > 0) is (mode != "disaggregated") for holds in summary["lock_holds"])
    RESULTS[mode] = summary


def test_the_placement_changes_the_schedule_not_what_is_learned() -> None:
    if len(RESULTS) < 2:
        pytest.skip("needs the fixed-placement runs")
    first, *others = RESULTS.values()
    for other in others:
        for key in ("reward/mean_reward", "judge/mean_score", "actor/policy_loss"):
            assert other[key] == pytest.approx(first[key], rel=1e-4, abs=1e-6), key


def test_the_judges_score_reaches_the_policy(backend: str) -> None:
    if "collocated" not in RESULTS:
        pytest.skip("needs the collocated run")
    unjudged = run_example(example.Config(placement=FIXED["collocated"][0], cpu_slots=2,
                                          judge_weight=0.0, timeout=120))
    judged = RESULTS["collocated"]
    assert unjudged["reward/mean_reward"] == pytest.approx(judged["reward/mean_reward"])
    assert unjudged["actor/policy_loss"][0] != pytest.approx(judged["actor/policy_loss"][0],
                                                             rel=1e-6, abs=1e-9)


def test_auto_profiles_plans_and_launches_the_users_component(backend: str) -> None:
    summary = run_example(example.Config(placement="auto", cpu_slots=2, timeout=120))
    assert summary["mode"] in ("collocated", "hybrid", "disaggregated")
    assert "judge" in summary["placement"]
    assert math.isfinite(summary["predicted_s"]) and summary["predicted_s"] > 0
    assert summary["measured_s"] > 0 and math.isfinite(summary["relative_error"])


def test_the_example_is_a_program() -> None:
    out = subprocess.run([sys.executable, str(EXAMPLE), "--help"], capture_output=True,
                         text=True, timeout=120, check=True).stdout
    assert "--placement" in out and "reward model" in out
