"""Cheap checks an answer passes before any comparison: malformed answers (`3-`), answers
naming a different variable than the reference (`y=3` for `x=3`), and numbers too large
to evaluate (`9^{9^{9^9}}`), which are refused before sympy tries to."""

from __future__ import annotations

import math
import re

from rlinf.envs.math.extract import _balanced_group

__all__ = ["MAX_DIGITS", "absurd_power", "assigned_variable", "is_malformed"]

MAX_DIGITS = 1e6
"""Most decimal digits of a number-power tower that comparisons may evaluate
(`2^{2023}` has 610, `9^{9^9}` 3.7e8); larger ones are refused as answers."""

_ASSIGNED_RE = re.compile(r"^\$?\s*([A-Za-z](?:_\{?\w+\}?)?)\s*=(?!=)")
_TRAILING_OPERATOR_RE = re.compile(r"(?:[-+*/^_=,]|\\cdot|\\times|\\div|\\pm)$")
_LEADING_OPERATOR_RE = re.compile(r"^(?:[*/^_,]|\\cdot|\\times|\\div)")
_NUMBER_RE = re.compile(r"^\d+(?:\.\d+)?$")
_POWER_RE = re.compile(r"(?<![\d.])(\d+(?:\.\d+)?)\s*\^\s*")


def assigned_variable(text: str) -> str | None:
    """The variable an answer assigns (`x` of `x = 3`, `a_1` of `a_1=2`), else None."""
    match = _ASSIGNED_RE.match(text.strip())
    return match.group(1).replace("{", "").replace("}", "") if match else None


def is_malformed(normalized: str) -> bool:
    """Whether a normalized answer (`rlinf.envs.math.normalize_answer`) cannot be a
    complete expression: starting or ending with an operator (`3-`, `*2`), or with
    unbalanced braces. math-verify would read `3-` as 3."""
    if _TRAILING_OPERATOR_RE.search(normalized):
        return True
    if _LEADING_OPERATOR_RE.match(normalized):
        return True
    depth = 0
    for char in normalized.replace("\\{", "").replace("\\}", ""):
        depth += (char == "{") - (char == "}")
        if depth < 0:
            return True
    return depth != 0


def _operand(text: str) -> tuple[str, str] | None:
    """The exponent at the start of `text` (a brace group or one character) and the rest."""
    if not text:
        return None
    if text[0] == "{":
        group = _balanced_group(text, 0)
        return None if group is None else (group, text[len(group) + 2:])
    return text[0], text[1:]


def _power_log10(base: str, rest: str) -> tuple[float | None, str]:
    """log10 of `base` raised to the exponent at the start of `rest` (inf when too large
    to say; None when the exponent is not a number or tower), and the text after it."""
    parts = _operand(rest)
    if parts is None:
        return None, rest
    exponent, tail = _log10(parts[0]), parts[1]
    if exponent is None:
        return None, tail
    value = float(base)
    if value <= 1:
        return 0.0, tail
    return (math.inf if exponent > 300 else 10**exponent * math.log10(value)), tail


def _log10(text: str) -> float | None:
    """log10 of the number or number-power tower that is all of `text`, else None."""
    text = text.strip()
    if _NUMBER_RE.match(text):
        number = float(text)
        return math.log10(number) if number > 1 else 0.0
    power = _POWER_RE.match(text)
    if power is None:
        return None
    value, tail = _power_log10(power.group(1), text[power.end():])
    return None if tail.strip() else value


def absurd_power(text: str) -> bool:
    """Whether `text` raises a number to a tower worth more than `MAX_DIGITS` digits."""
    for power in _POWER_RE.finditer(text):
        value, _ = _power_log10(power.group(1), text[power.end():])
        if value is not None and value > MAX_DIGITS:
            return True
    return False
