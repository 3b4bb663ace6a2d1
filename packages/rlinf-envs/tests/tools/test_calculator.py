"""The calculator tool: exact arithmetic, no eval, refusals that say why."""

from __future__ import annotations

import pytest

from rlinf.envs.tools import calculate


@pytest.mark.parametrize(("expression", "value"), [
    ("2 + 3 * 4", "14"),
    ("7/2", "3.5"),
    ("1/3*3", "1"),
    ("(12 + 7) * -2", "-38"),
    ("2**10", "1024"),
    ("17 // 5 + 17 % 5", "5"),
    ("sqrt(16)", "4"),
    ("factorial(10)", "3628800"),
    ("gcd(84, 36)", "12"),
    ("round(2.675, 2)", "2.67"),
    ("2 * pi", "6.283185307179586"),
])
def test_expressions_evaluate_exactly(expression: str, value: str) -> None:
    result = calculate(expression)
    assert result.ok, result.error
    assert result.output == value


@pytest.mark.parametrize(("expression", "message"), [
    ("__import__('os').system('id')", "cannot evaluate"),
    ("open('/etc/passwd')", "cannot evaluate"),
    ("(1).__class__", "cannot evaluate"),
    ("9**9**9", "an exponent over"),
    ("factorial(100000)", "factorial of more than 1000"),
    ("1/0", "ZeroDivisionError"),
    ("2 +", "syntax error"),
    ("1" * 600, "longer than 500"),
])
def test_what_it_does_not_evaluate_is_an_error(expression: str, message: str) -> None:
    result = calculate(expression)
    assert not result.ok and message in (result.error or ""), result
