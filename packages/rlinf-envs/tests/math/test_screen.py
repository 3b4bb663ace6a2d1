from __future__ import annotations

import pytest

from rlinf.envs.math.screen import absurd_power, assigned_variable, is_malformed


@pytest.mark.parametrize(("text", "expected"), [
    ("9^{9^{9^9}}", True),
    ("9^{9^9}", True),  # 3.7e8 digits
    ("x^{9^{9^9}}", True),  # the tower inside
    ("10^{10^{7}}", True),
    ("2^{2023}", False),
    ("10^{100000}", False),
    ("2^x", False),
    ("9^{9^{x}}", False),  # not a number: left to the time-limited comparison
    ("1^{10^{400}}", False),  # 1 to any power is 1
    ("1^{9^{9^9}}", True),  # but sympy would still expand the exponent
    ("(9^{9})^{9^{9}}", False),  # a parenthesised base is not evaluated here
])
def test_absurd_power(text: str, expected: bool) -> None:
    assert absurd_power(text) is expected


@pytest.mark.parametrize(("normalized", "expected"), [
    ("3-", True), ("x^2+", True), ("1,2,", True), ("*2", True), ("3\\cdot", True),
    ("{1", True), ("1}", True), ("\\frac{1}{2", True),
    ("3", False), ("-3", False), ("+3", False), ("\\{1,2\\}", False), ("[1,2)", False),
    ("(1,2)", False), ("", False),
])
def test_is_malformed(normalized: str, expected: bool) -> None:
    assert is_malformed(normalized) is expected


@pytest.mark.parametrize(("text", "expected"), [
    ("x = 3", "x"), ("$y=3$", "y"), ("a_1=2", "a_1"), ("x_{12} = 2", "x_12"),
    ("3", None), ("x==3", None), ("2x=6", None),
])
def test_assigned_variable(text: str, expected: str | None) -> None:
    assert assigned_variable(text) == expected
