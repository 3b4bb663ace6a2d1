"""The math-verify comparison itself, as the verifier's helper process runs it
(`rlinf.envs.math._verify_child`); nothing here bounds its own time.

Decimals are made exact before math-verify sees them: math-verify rounds floats to 6 places
(`0.8660254` would equal `\\frac{\\sqrt3}{2}`), and the verifier's numeric tolerance is an
explicit option instead (`rel_tol`, `rlinf.envs.math.check_answer`).
"""

from __future__ import annotations

import logging
from typing import Any

__all__ = ["WARM_UP_ANSWERS", "symbolic_equal", "warm_up"]

WARM_UP_ANSWERS = ("1,2,3", "2^3", "\\frac{\\sqrt{2}}{2}", "x+1", "(1,2)", "\\pi")
"""Answers whose first parse costs math-verify the most (imports of the parser's parts)."""


def _math_verify() -> Any:
    import math_verify

    # Its timeouts are off on purpose (the caller's deadline bounds the helper); without
    # this it warns so on every helper's first comparison.
    logging.getLogger("math_verify").setLevel(logging.ERROR)
    return math_verify


def _exact(expr: Any) -> Any:
    """`expr` with each float replaced by the rational its digits write (0.1 -> 1/10)."""
    import sympy

    if not isinstance(expr, sympy.Basic):
        return expr
    floats = expr.atoms(sympy.Float)
    return expr.xreplace({f: sympy.Rational(str(f)) for f in floats}) if floats else expr


def _close(gold: list[Any], target: list[Any], rel_tol: float) -> bool:
    """Whether a scalar written with a decimal on either side is within `rel_tol` of the
    other (relative to the larger magnitude); expressions with variables never are."""
    import sympy

    for g in gold:
        for t in target:
            if not (isinstance(g, sympy.Expr) and isinstance(t, sympy.Expr)):
                continue
            if not (g.atoms(sympy.Float) or t.atoms(sympy.Float)):
                continue
            if g.free_symbols or t.free_symbols:
                continue
            try:
                a, b = complex(g.evalf(30)), complex(t.evalf(30))
            except (TypeError, ValueError, OverflowError):
                continue
            if abs(a - b) <= rel_tol * max(abs(a), abs(b)):
                return True
    return False


def symbolic_equal(predicted: str, reference: str, *, rel_tol: float = 0.0) -> bool:
    """Whether math-verify finds the LaTeX answers equal, decimals taken exactly; with
    ``rel_tol > 0`` a decimal scalar also matches a numeric value within it."""
    math_verify = _math_verify()
    gold = math_verify.parse(f"${reference}$", parsing_timeout=None)
    target = math_verify.parse(f"${predicted}$", parsing_timeout=None)
    if not gold or not target:
        return False
    if math_verify.verify([_exact(g) for g in gold], [_exact(t) for t in target],
                          timeout_seconds=None):
        return True
    return rel_tol > 0 and _close(gold, target, rel_tol)


def warm_up() -> None:
    """Pay math-verify's import and its parser's first uses (under a second) now."""
    for answer in WARM_UP_ANSWERS:
        symbolic_equal(answer, "12")
