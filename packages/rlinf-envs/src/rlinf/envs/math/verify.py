"""Answer verification: exact numeric comparison first, math-verify for the rest.

Order of trust, for `backend="auto"`:

0. Multiple-choice labels decide when both answers carry one (`(A)` = `A` =
   `\\text{(A)}\\ \\sqrt2`); a label with content on one side only is compared by its
   content (`rlinf.envs.math.choices`). Screening refuses a malformed answer (`3-`), one
   assigning another variable than the reference (`y=3` for `x=3`), and number towers too
   large to evaluate (`rlinf.envs.math.screen`).
1. Both answers parse as rational numbers (integers, decimals, `a/b`, `\\frac{a}{b}`,
   thousands separators) → compare the exact `Fraction`s. This is the built-in path and it
   is deliberately strict: `1/2 == 0.5`, `3.0 == 3` and `-0 == 0` hold, `0.33 != 1/3` and
   `0.333333 != 1/3` (math-verify rounds floats to 6 places and would accept the latter).
   A percentage on one side only (`50\\%` against `0.5`) also matches its value over 100;
   datasets write a percentage's gold answer with the sign, without it, or as a fraction.
2. Otherwise math-verify (extra `math`) compares the expressions symbolically (`\\sqrt{4}`
   vs `2`, `\\pi/2` vs `\\frac{\\pi}{2}`, tuples, intervals), decimals taken exactly, in
   this process's helper process under a time limit that holds in any thread
   (`rlinf.envs.math._verify_process`): past it the answer is `Verdict.TIMED_OUT`, which
   scores as wrong.
3. Without math-verify: equality of the normalized LaTeX strings.

`backend="builtin"` skips step 2; `backend="math_verify"` requires it. `rel_tol` loosens
steps 1 and 2 for decimals (`check_answer`).

math-verify's first uses are slow: importing it (and sympy) and the first parse of each
kind of expression take most of a second, then milliseconds per answer. A reward worker
pays that inside a training step unless it calls `warm_up_verifier` when it starts.
"""

from __future__ import annotations

import enum
import math
import re
from collections.abc import Mapping
from fractions import Fraction
from typing import Literal

import structlog

from rlinf.envs._extras import is_installed, require_installed
from rlinf.envs.errors import ConfigError, VerifierError
from rlinf.envs.math._verify_process import shared_process
from rlinf.envs.math.choices import resolve_choice
from rlinf.envs.math.screen import absurd_power, assigned_variable, is_malformed

__all__ = ["DEFAULT_TIMEOUT", "Backend", "Verdict", "check_answer", "is_equivalent",
           "normalize_answer", "parse_number", "warm_up_verifier"]

Backend = Literal["auto", "builtin", "math_verify"]
_BACKENDS: tuple[Backend, ...] = ("auto", "builtin", "math_verify")

DEFAULT_TIMEOUT = 5.0
"""Seconds one math-verify comparison may take (math-verify's own default): ordinary
answers take milliseconds, a slow but legitimate simplification a second or two."""

_MAX_EXPONENT = 1000
"""Largest |exponent| of a number in scientific notation read exactly (`1e99999999` would
take minutes to expand); beyond it the answer goes to the time-limited path."""

_log = structlog.get_logger(__name__)

_UNSIGNED = r"(?:\d{1,3}(?:,\d{3})+|\d+)(?:\.\d*)?(?:[eE][-+]?\d+)?|\.\d+(?:[eE][-+]?\d+)?"
_DECIMAL_RE = re.compile(rf"^([-+]?)({_UNSIGNED})$")
_SLASH_RE = re.compile(rf"^([-+]?)\(?({_UNSIGNED})\)?/\(?({_UNSIGNED})\)?$")
_FRAC_RE = re.compile(
    rf"^([-+]?)\\frac(?:\{{([-+]?{_UNSIGNED})\}}|(\d))(?:\{{([-+]?{_UNSIGNED})\}}|(\d))$")
_EXPONENT_RE = re.compile(r"\d[eE]([-+]?\d+)")
_DECIMAL_POINT_RE = re.compile(r"\.\d|\d[eE]")
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


def _huge_exponent(answer: str) -> bool:
    """Whether scientific notation in `answer` has an exponent beyond `_MAX_EXPONENT`."""
    for exponent in _EXPONENT_RE.findall(answer):
        digits = exponent.lstrip("-+").lstrip("0")
        if len(digits) > len(str(_MAX_EXPONENT)) or (digits and int(digits) > _MAX_EXPONENT):
            return True
    return False


def _unsigned(text: str) -> Fraction:
    return Fraction(text.replace(",", ""))


def parse_number(text: str) -> Fraction | None:
    """The exact rational value of a numeric answer, or None when it is not a plain number.

    Accepts integers, decimals, scientific notation, thousands separators in groups of
    three (`1,234`; `1,2` is not a number), `a/b`, `\\frac{a}{b}`, `\\frac12`, and a sign.
    """
    answer = normalize_answer(text)
    if not answer or _huge_exponent(answer):
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


def _close(left: Fraction, right: Fraction, rel_tol: float) -> bool:
    return left == right or abs(left - right) <= rel_tol * max(abs(left), abs(right))


def _numbers_equal(predicted: str, reference: str, left: Fraction, right: Fraction,
                   rel_tol: float) -> bool:
    # Only a decimal is an approximation: integers and fractions always compare exactly.
    decimal = bool(_DECIMAL_POINT_RE.search(normalize_answer(predicted))
                   or _DECIMAL_POINT_RE.search(normalize_answer(reference)))
    tol = rel_tol if decimal else 0.0
    if _close(left, right, tol):
        return True
    # "50%" against 0.5: a percentage on one side only also reads as its value / 100.
    left_percent, right_percent = _is_percent(predicted), _is_percent(reference)
    if left_percent and not right_percent:
        return _close(left / 100, right, tol)
    if right_percent and not left_percent:
        return _close(left, right / 100, tol)
    return False


class Verdict(enum.Enum):
    """What `check_answer` decided."""

    EQUAL = "equal"
    DIFFERENT = "different"
    TIMED_OUT = "timed_out"
    """math-verify did not decide within the time limit (or its helper process died on the
    answers): scored as wrong, and worth counting."""


def _verdict(equal: bool) -> Verdict:
    return Verdict.EQUAL if equal else Verdict.DIFFERENT


def _uses_math_verify(backend: Backend) -> bool:
    # Installed is enough: math-verify runs in the helper process, never imported here.
    return backend == "math_verify" or (backend == "auto" and is_installed("math_verify"))


def _check_backend(backend: Backend) -> None:
    if backend not in _BACKENDS:
        raise ConfigError(f"unknown verification backend {backend!r}; expected one of {_BACKENDS}")


def check_answer(
    predicted: str | None,
    reference: str,
    *,
    backend: Backend = "auto",
    timeout: float = DEFAULT_TIMEOUT,
    rel_tol: float = 0.0,
    choices: Mapping[str, str] | None = None,
) -> Verdict:
    """Whether the extracted answer `predicted` equals the reference final answer, or
    `Verdict.TIMED_OUT` when math-verify did not decide within `timeout` seconds.

    `rel_tol` is the numeric tolerance. 0 (the default) compares numbers exactly: a decimal
    equals only the value it writes (`0.5 = 1/2`, but `0.8660254 != \\frac{\\sqrt3}{2}`
    and `0.333333 != 1/3`). Exact is the default because a reward that takes a rounded
    decimal for an exact answer teaches a policy to approximate instead of solving, and how
    many places would be "enough" depends on the task. A positive value (e.g. 1e-6, for
    tasks whose answers are measured or rounded) lets a number written as a decimal on
    either side match a numeric value within ``rel_tol`` times the larger magnitude;
    integers, fractions and expressions with variables, tuples or sets stay exact.

    `choices` maps the options of a multiple-choice task to their contents (``{"A":
    "\\sqrt2"}``), so an answer giving either the label or the content matches.
    """
    _check_backend(backend)
    if not (timeout > 0 and math.isfinite(timeout)):
        raise ConfigError(f"timeout must be a positive number of seconds, got {timeout}")
    if not (rel_tol >= 0 and math.isfinite(rel_tol)):
        raise ConfigError(f"rel_tol must be a finite number >= 0, got {rel_tol}")
    if predicted is None or not predicted.strip():
        return Verdict.DIFFERENT
    pair = resolve_choice(predicted, reference, choices)
    if isinstance(pair, bool):
        return _verdict(pair)
    return _compare(*pair, backend=backend, timeout=timeout, rel_tol=rel_tol)


def _compare(predicted: str, reference: str, *, backend: Backend, timeout: float,
             rel_tol: float) -> Verdict:
    if predicted.strip() == reference.strip():
        return Verdict.EQUAL
    variables = assigned_variable(predicted), assigned_variable(reference)
    if None not in variables and variables[0] != variables[1]:
        return Verdict.DIFFERENT
    normalized = normalize_answer(predicted)
    if is_malformed(normalized):
        return Verdict.DIFFERENT
    left, right = parse_number(predicted), parse_number(reference)
    if left is not None and right is not None:
        return _verdict(_numbers_equal(predicted, reference, left, right, rel_tol))
    if _uses_math_verify(backend):
        if absurd_power(predicted) or absurd_power(reference):
            _log.info("verify_refused_power", predicted=predicted[:80])
            return Verdict.DIFFERENT
        require_installed("math_verify", extra="math", feature="symbolic answer verification")
        helper = shared_process()
        helper.start()  # a helper that cannot start is an error under any backend
        try:
            equal = helper.compare(predicted, reference, rel_tol=rel_tol, timeout=timeout)
        except VerifierError as exc:  # math-verify raised on odd LaTeX
            if backend == "math_verify":
                raise
            _log.warning("math_verify_failed", error=str(exc)[:300], predicted=predicted[:80])
        else:
            return Verdict.TIMED_OUT if equal is None else _verdict(equal)
    # `normalize_answer` drops `\\text{...}`: two answers of text alone are not "equal".
    return _verdict(bool(normalized) and normalized == normalize_answer(reference))


def is_equivalent(
    predicted: str | None,
    reference: str,
    *,
    backend: Backend = "auto",
    timeout: float = DEFAULT_TIMEOUT,
    rel_tol: float = 0.0,
    choices: Mapping[str, str] | None = None,
) -> bool:
    """Whether `check_answer` finds the answers equal (a timed-out comparison is not)."""
    return check_answer(predicted, reference, backend=backend, timeout=timeout,
                        rel_tol=rel_tol, choices=choices) is Verdict.EQUAL


def warm_up_verifier(backend: Backend = "auto") -> bool:
    """Start this process's math-verify helper now, so that it pays math-verify's import and
    parser start-up in a process of its own while this one goes on, not
    inside the first scoring (which waits for it to be ready); whether math-verify is in
    use. Idempotent."""
    _check_backend(backend)
    if not _uses_math_verify(backend):
        return False
    require_installed("math_verify", extra="math", feature="symbolic answer verification")
    shared_process().start(wait=False)  # it warms up beside whatever this process does next
    return True
