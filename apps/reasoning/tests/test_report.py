"""Printed figures: one rounding rule (halves up, float noise dropped) for every accuracy and
gain a run prints."""

from __future__ import annotations

import numpy as np
import pytest
from rlinf_reasoning.report import Summary, format_fixed


@pytest.mark.parametrize(("value", "places", "text"), [
    (0.3925, 3, "0.393"),                      # float64: 0.39250000000000001554
    (float(np.float32(157) / np.float32(400)), 3, "0.393"),  # float32: 0.39249998...
    (0.0625, 3, "0.063"), (0.0, 3, "0.000"), (1.0, 3, "1.000"),
    (100 * (0.5 - 0.3025), 1, "19.8"),         # 19.749999999999996 in binary
    (-1e-12, 3, "0.000"),                      # no "-0.000"
])
def test_halves_round_up_whatever_the_float_noise(value: float, places: int, text: str) -> None:
    assert format_fixed(value, places) == text


def test_signs_on_request() -> None:
    assert format_fixed(19.75, 1, sign=True) == "+19.8"
    assert format_fixed(-2.25, 1, sign=True) == "-2.3"
    assert format_fixed(0.0, 1, sign=True) == "+0.0"


def test_the_summary_prints_with_that_rule() -> None:
    summary = Summary(heldout_before=0.3025, heldout_after=0.5, steps=3, wall_seconds=1.0,
                      total_seconds=2.0, samples=48, samples_per_s=48.0, mode="collocated",
                      placement="rollout,reward,inference,actor: 0", predicted_iteration_s=None,
                      measured_iteration_s=None)
    assert "held-out accuracy   0.303 -> 0.500 (+19.8 points)" in summary.format()
