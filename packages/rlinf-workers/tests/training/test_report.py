"""Printed figures: one rounding rule (halves up, float noise dropped) for every figure a run
summary prints (`format_fixed`)."""

from __future__ import annotations

import numpy as np
import pytest

from rlinf.workers.training.report import format_fixed


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
