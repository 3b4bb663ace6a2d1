"""Answer verification: exact numeric comparison first, math-verify for the rest.

Order of trust, for `backend="auto"`:

1. Both answers parse as rational numbers (integers, decimals, `a/b`, `\\frac{a}{b}`,
   thousands separators) → compare the exact `Fraction`s. This is the built-in path and it
   is deliberately strict: `1/2 == 0.5`, `3.0 == 3` and `-0 == 0` hold, `0.33 != 1/3` and
   `0.333333 != 1/3` (math-verify rounds floats to 6 places and would accept the latter).
   A percentage on one side only (`50\\%` against `0.5`) also matches its value over 100;
   datasets write a percentage's gold answer with the sign, without it, or as a fraction.
2. Otherwise math-verify (extra `math`, imported lazily) compares the expressions
   symbolically (`\\sqrt{4}` vs `2`, `\\pi/2` vs `\\frac{\\pi}{2}`, tuples, intervals).
3. Without math-verify: equality of the normalized LaTeX strings.

`backend="builtin"` skips step 2; `backend="math_verify"` requires it.

math-verify's first uses are slow: importing it (and sympy) and the first parse of each
kind of expression took 0.65 s in all on the bench host, then milliseconds per answer.
A reward worker pays that inside a training step unless it calls `warm_up_verifier` when
it starts; in the collocated reasoning bench the first steps after warm-up were 0.2 s
(10%) slower, one reward process at a time, until it did.
"""

from __future__ import annotations

import re
import threading
from fractions import Fraction
from typing import Any, Literal

import structlog

from rlinf.envs._extras import has_module, import_extra
from rlinf.envs.errors import ConfigError

Backend = Literal["auto", "builtin", "math_verify"]
_BACKENDS: tuple[Backend, ...] = ("auto", "builtin", "math_verify")

_log = structlog.get_logger(__name__)

_UNSIGNED = r"(?:\d{1,3}(?:,\d{3})+|\d+)(?:\.\d*)?(?:[eE][-+]?\d+)?|\.\d+(?:[eE][-+]?\d+)?"
_DECIMAL_RE = re.compile(rf"^([-+]?)({_UNSIGNED})$")
_SLASH_RE = re.compile(rf"^([-+]?)\(?({_UNSIGNED})\)?/\(?({_UNSIGNED})\)?$")
_FRAC_RE = re.compile(
    rf"^([-+]?)\\frac(?:\{{([-+]?{_UNSIGNED})\}}|(\d))(?:\{{([-+]?{_UNSIGNED})\}}|(\d))$")
_LHS_RE = re.compile(r"^[A-Za-z](?:_\{?\w+\}?)?\s*=\s*(?!=)")
_TEXT_RE = re.compile(r"\\(?:text|textbf|mathrm|mbox)\{[^{}]*\}")
_DROP = (
    "\\left", "\\right", "\\displaystyle", "\\!", "\\,", "\\;", "\\:", "\\ ", "~",
    "^\\circ", "^{\\circ}", "\\%", "%", "\\$",
)


def normalize_answer(text: str) -> str:
    """Canonical text form of an answer: no `$`, spacing macros, units, trailing period.

    `\\dfrac`/`\\tfrac` become `\\frac`, a leading `x =` is dropped, whitespace is removed.
    """
    answer = text.strip().replace("−", "-")
    answer = _TEXT_RE.sub("", answer)
    for token in _DROP:
        answer = answer.replace(token, "")
    answer = answer.replace("\\dfrac", "\\frac").replace("\\tfrac", "\\frac")
    answer = answer.replace("$", "").strip()  # math delimiters; currency went above
    answer = _LHS_RE.sub("", answer)
    answer = answer.rstrip(".").strip()
    return re.sub(r"\s+", "", answer)


def _unsigned(text: str) -> Fraction:
    return Fraction(text.replace(",", ""))


def parse_number(text: str) -> Fraction | None:
    """The exact rational value of a numeric answer, or None when it is not a plain number.

    Accepts integers, decimals, scientific notation, thousands separators in groups of
    three (`1,234`; `1,2` is not a number), `a/b`, `\\frac{a}{b}`, `\\frac12`, and a sign.
    """
    answer = normalize_answer(text)
    if not answer:
        return None
    try:
        if match := _DECIMAL_RE.match(answer):
            value = _unsigned(match.group(2))
        elif match := _SLASH_RE.match(answer):
            value = _unsigned(match.group(2)) / _unsigned(match.group(3))
        elif match := _FRAC_RE.match(answer):
            numerator = match.group(2) or match.group(3)
            denominator = match.group(4) or match.group(5)
            value = _unsigned(numerator) / _unsigned(denominator)
        else:
            return None
    except (ValueError, ZeroDivisionError):
        return None
    return -value if match.group(1) == "-" else value


def _is_percent(text: str) -> bool:
    """Whether a numeric answer carries a percent sign (``%`` or ``\\%``)."""
    return "%" in text


def _math_verify_equal(predicted: str, reference: str) -> bool:
    math_verify: Any = import_extra(
        "math_verify", extra="math", feature="symbolic answer verification"
    )
    # math-verify enforces its timeouts with SIGALRM, which only the main thread may use.
    in_main = threading.current_thread() is threading.main_thread()
    parse_timeout = 5 if in_main else None
    gold = math_verify.parse(f"${reference}$", parsing_timeout=parse_timeout)
    target = math_verify.parse(f"${predicted}$", parsing_timeout=parse_timeout)
    if not gold or not target:
        return False
    return bool(math_verify.verify(gold, target, timeout_seconds=5 if in_main else None))


_WARM_UP_ANSWERS = ("1,2,3", "2^3", "\\frac{\\sqrt{2}}{2}", "x+1", "(1,2)", "\\pi")
"""Answers whose first parse costs math-verify the most (imports of the parser's parts)."""

_warmed: set[str] = set()
"""Holds "math_verify" once this process warmed it up."""


def warm_up_verifier(backend: Backend = "auto") -> bool:
    """Pay math-verify's one-time import and parser start-up now (once per process, under
    a second) rather than inside the first scoring; whether math-verify is in use."""
    if backend == "builtin" or (backend == "auto" and not has_module("math_verify")):
        return False
    if "math_verify" not in _warmed:  # an unknown backend: is_equivalent's ConfigError
        for answer in _WARM_UP_ANSWERS:
            is_equivalent(answer, "12", backend=backend)
        _warmed.add("math_verify")
    return True


def is_equivalent(predicted: str | None, reference: str, *, backend: Backend = "auto") -> bool:
    """Whether the extracted answer `predicted` equals the reference final answer."""
    if backend not in _BACKENDS:
        raise ConfigError(f"unknown verification backend {backend!r}; expected one of {_BACKENDS}")
    if predicted is None or not predicted.strip():
        return False
    left, right = parse_number(predicted), parse_number(reference)
    if left is not None and right is not None:
        if left == right:
            return True
        # "50%" against 0.5: a percentage on one side only also reads as its value / 100.
        left_percent, right_percent = _is_percent(predicted), _is_percent(reference)
        if left_percent and not right_percent:
            return left / 100 == right
        if right_percent and not left_percent:
            return left == right / 100
        return False
    if backend == "math_verify" or (backend == "auto" and has_module("math_verify")):
        try:
            return _math_verify_equal(predicted, reference)
        except Exception as exc:  # math-verify/sympy raise arbitrary errors on odd LaTeX
            if backend == "math_verify" or isinstance(exc, ImportError):
                raise
            _log.warning("math_verify_failed", error=repr(exc), predicted=predicted[:80])
    return normalize_answer(predicted) == normalize_answer(reference)
