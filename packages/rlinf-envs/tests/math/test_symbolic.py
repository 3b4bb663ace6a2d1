"""The comparison the verifier's helper runs, called in this process (benign inputs)."""

from __future__ import annotations

import pytest

pytest.importorskip("math_verify", reason="rlinf-envs[math]")

from rlinf.envs.math import _symbolic
from rlinf.envs.math._symbolic import WARM_UP_ANSWERS, symbolic_equal


def test_decimals_are_exact_unless_a_tolerance_is_given() -> None:
    assert not symbolic_equal("0.8660254", "\\frac{\\sqrt3}{2}")
    assert symbolic_equal("0.8660254", "\\frac{\\sqrt3}{2}", rel_tol=1e-6)
    assert not symbolic_equal("0.8660254", "\\frac{\\sqrt3}{2}", rel_tol=1e-9)
    assert symbolic_equal("1.41421356", "\\sqrt{2}", rel_tol=1e-6)
    assert symbolic_equal("x=0.5", "x=\\frac{1}{2}")  # exact values still match
    # Tolerance is for scalars: an expression with a variable stays exact.
    assert not symbolic_equal("0.8660254x", "\\frac{\\sqrt3}{2}x", rel_tol=1e-6)


def test_symbolic_answers() -> None:
    assert symbolic_equal("\\sqrt{4}", "2")
    assert not symbolic_equal("y=3", "x=3")
    assert not symbolic_equal("", "2")


def test_warm_up_parses_each_kind_of_answer(monkeypatch: pytest.MonkeyPatch) -> None:
    parsed: list[str] = []
    monkeypatch.setattr(_symbolic, "symbolic_equal",
                        lambda predicted, reference, rel_tol=0.0: parsed.append(predicted))
    _symbolic.warm_up()
    assert parsed == list(WARM_UP_ANSWERS)
