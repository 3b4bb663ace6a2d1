"""Printed figures: one rounding rule (halves up, float noise dropped) for every accuracy and
gain a run prints."""

from __future__ import annotations

from rlinf_reasoning.report import Summary


def test_the_summary_prints_with_that_rule() -> None:
    summary = Summary(heldout_before=0.3025, heldout_after=0.5, steps=3, wall_seconds=1.0,
                      total_seconds=2.0, samples=48, samples_per_s=48.0, mode="collocated",
                      placement="rollout,reward,inference,actor: 0", predicted_iteration_s=None,
                      measured_iteration_s=None)
    assert "held-out accuracy   0.303 -> 0.500 (+19.8 points)" in summary.format()
