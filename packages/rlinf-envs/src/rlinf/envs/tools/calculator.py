"""A calculator tool: arithmetic expressions evaluated exactly, without ``eval``.

The expression is parsed with `ast` and only numbers, ``+ - * / // % **``, parentheses, the
constants ``pi`` and ``e`` and a few functions (``sqrt abs round floor ceil exp log sin cos
tan factorial gcd``) are evaluated; integers and fractions stay exact (``7/2`` is ``3.5``,
``1/3*3`` is ``1``), and results too large to be useful (huge powers, factorials) are
refused rather than computed.
"""

from __future__ import annotations

import ast
import math
import operator
import time
from collections.abc import Callable
from fractions import Fraction
from typing import Any

from rlinf.envs.tools.sandbox import ToolResult

__all__ = ["MAX_EXPRESSION", "calculate"]

MAX_EXPRESSION = 500
"""Longest expression accepted, in characters."""
_MAX_EXPONENT = 4096
_MAX_DIGITS = 4300  # CPython's own int-to-str limit

Number = Fraction | float
_BINARY: dict[type[ast.operator], Callable[[Any, Any], Any]] = {
    ast.Add: operator.add, ast.Sub: operator.sub, ast.Mult: operator.mul,
    ast.Div: operator.truediv, ast.FloorDiv: operator.floordiv, ast.Mod: operator.mod,
}
_FUNCTIONS: dict[str, Callable[..., Any]] = {
    "sqrt": math.sqrt, "abs": abs, "round": round, "floor": math.floor, "ceil": math.ceil,
    "exp": math.exp, "log": math.log, "sin": math.sin, "cos": math.cos, "tan": math.tan,
    "factorial": math.factorial, "gcd": math.gcd,
}
_CONSTANTS = {"pi": math.pi, "e": math.e}


class _Refused(ValueError):
    """The expression uses something the calculator does not evaluate."""


def calculate(expression: str) -> ToolResult:
    """The value of `expression` as text (an integer, or a decimal), or an error saying
    what could not be evaluated."""
    started = time.perf_counter()
    try:
        if len(expression) > MAX_EXPRESSION:
            raise _Refused(f"expression longer than {MAX_EXPRESSION} characters")
        value = _eval(ast.parse(expression.strip(), mode="eval").body)
        text = _format(value)
    except (SyntaxError, _Refused, ArithmeticError, ValueError, TypeError) as exc:
        kind = "syntax error" if isinstance(exc, SyntaxError) else type(exc).__name__
        return ToolResult(False, "", f"{kind}: {exc}", time.perf_counter() - started)
    return ToolResult(True, text, None, time.perf_counter() - started)


def _eval(node: ast.AST) -> Number:
    if isinstance(node, ast.Constant) and isinstance(node.value, int | float) and \
            not isinstance(node.value, bool):
        return Fraction(node.value) if isinstance(node.value, int) else node.value
    if isinstance(node, ast.Name) and node.id in _CONSTANTS:
        return _CONSTANTS[node.id]
    if isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.UAdd | ast.USub):
        inner = _eval(node.operand)
        return -inner if isinstance(node.op, ast.USub) else inner
    if isinstance(node, ast.BinOp):
        left, right = _eval(node.left), _eval(node.right)
        if isinstance(node.op, ast.Pow):
            return _power(left, right)
        if type(node.op) in _BINARY:
            return _BINARY[type(node.op)](left, right)  # type: ignore[no-any-return]
    if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and \
            node.func.id in _FUNCTIONS and not node.keywords:
        args = [_eval(a) for a in node.args]
        if node.func.id == "factorial" and (len(args) != 1 or args[0] > 1000):
            raise _Refused("factorial of more than 1000")
        if node.func.id in ("factorial", "gcd", "floor", "ceil", "round", "abs"):
            ints = [int(a) if isinstance(a, Fraction) and a.denominator == 1 else a
                    for a in args]
            return _number(_FUNCTIONS[node.func.id](*ints))
        return _number(_FUNCTIONS[node.func.id](*[float(a) for a in args]))
    raise _Refused(f"cannot evaluate {ast.unparse(node)!r}: only numbers, + - * / // % **, "
                   f"pi, e and {', '.join(sorted(_FUNCTIONS))}")


def _power(base: Number, exponent: Number) -> Number:
    if isinstance(exponent, Fraction) and exponent.denominator == 1:
        if abs(exponent) > _MAX_EXPONENT:
            raise _Refused(f"an exponent over {_MAX_EXPONENT}")
        if isinstance(base, Fraction):
            return base ** int(exponent)
    return float(base) ** float(exponent)


def _number(value: Any) -> Number:
    return Fraction(value) if isinstance(value, int) else float(value)


def _format(value: Number) -> str:
    if isinstance(value, Fraction):
        if value.denominator == 1:
            if abs(value.numerator).bit_length() > _MAX_DIGITS * 3.33:
                raise _Refused("a result with more than 4300 digits")
            return str(value.numerator)
        return repr(float(value))
    if not math.isfinite(value):
        raise ArithmeticError(f"the result is {value}")
    return repr(int(value)) if value.is_integer() and abs(value) < 1e15 else repr(value)
