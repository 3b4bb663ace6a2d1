"""The PPO-with-critic-and-reference example, for real, on 2 CPU slots: two iterations in
every placement mode (collocated, hybrid, disaggregated on 5 oversubscribed slots) and
``auto`` (profiled at two batch sizes on 1 and 2 devices, planned, launched). Each run must
give finite losses, move the weights, use the device lock exactly where devices are shared,
learn the same thing whatever the placement, and leave nothing behind: no Ray actor, no CPU
reservation, no shared-memory segment."""

from __future__ import annotations

import math
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from .conftest import leaving_nothing

EXAMPLE = Path(__file__).resolve().parents[1] / "ppo_critic_math.py"
sys.path.insert(0, str(EXAMPLE.parent))
import ppo_critic_math as example  # noqa: E402

FIXED = {  # mode: (placement, CPU slots)
    "collocated": ("rollout,reward,inference,reference,actor: 0", 2),
    "hybrid": ("rollout: 0, reward,inference,reference,actor: 1", 2),
    "disaggregated": ("rollout: 0, reward: 1, inference: 2, reference: 3, actor: 4", 5),
}
RESULTS: dict[str, dict[str, Any]] = {}


def run_example(cfg: example.Config) -> dict[str, Any]:
    summary = leaving_nothing(lambda: example.main(cfg))
    assert len(summary["iteration_s"]) == 2
    for name, values in summary["losses"].items():
        assert all(math.isfinite(v) for v in values), (name, values)
    assert summary["losses"]["value_loss"][0] > 0  # the critic has something to learn
    assert summary["losses"]["kl"][1] > 0  # the policy moved away from the reference
    before_norm, after_norm = summary["parameter_norm"]
    assert after_norm != before_norm  # two PPO steps changed the weights
    # Receivers in the actor's process copy its weights there; the others map shared memory.
    (transports,) = summary["weight_sync"]
    assert set(transports.split("+")) <= {"inprocess", "shm"}
    return summary


WEIGHT_SYNC = {"collocated": "inprocess", "hybrid": "inprocess+shm", "disaggregated": "shm"}
"""The weight sync's transports to inference and rollout (in that order) in each mode: one
process serves every component placed on the same devices."""


@pytest.mark.parametrize("mode", list(FIXED))
def test_every_fixed_placement_trains_and_leaves_nothing(backend: str, mode: str) -> None:
    placement, slots = FIXED[mode]
    summary = run_example(example.Config(placement=placement, cpu_slots=slots, timeout=120))
    assert summary["mode"] == mode
    shared = mode != "disaggregated"
    assert summary["device_lock"] is shared
    assert summary["weight_sync"] == [WEIGHT_SYNC[mode]]
    assert all((holds > 0) is shared for holds in summary["lock_holds"])
    RESULTS[mode] = summary


def test_the_placement_changes_the_schedule_not_what_is_learned() -> None:
    if len(RESULTS) < 2:
        pytest.skip("needs the fixed-placement runs")
    first, *others = RESULTS.values()
    for other in others:
        for name, values in first["losses"].items():
            assert other["losses"][name] == pytest.approx(values, rel=1e-4, abs=1e-6), name
        assert other["parameter_norm"] == pytest.approx(first["parameter_norm"], rel=1e-6)


def test_auto_profiles_plans_launches_and_reports_its_prediction(backend: str) -> None:
    summary = run_example(example.Config(placement="auto", cpu_slots=2, profile_sizes=(4, 8),
                                         profile_devices=(1, 2), timeout=120))
    assert summary["mode"] in ("collocated", "hybrid", "disaggregated")
    assert summary["device_lock"] is (summary["mode"] != "disaggregated")
    assert math.isfinite(summary["predicted_s"]) and summary["predicted_s"] > 0
    assert summary["measured_s"] > 0 and math.isfinite(summary["relative_error"])
    assert summary["profile_s"] > 0


def test_the_example_is_a_program() -> None:
    out = subprocess.run([sys.executable, str(EXAMPLE), "--help"], capture_output=True,
                         text=True, timeout=120, check=True).stdout
    assert "--placement" in out and "PPO with a critic" in out
