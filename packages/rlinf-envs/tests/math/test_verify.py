from __future__ import annotations

import threading
from fractions import Fraction

import pytest
from hypothesis import given
from hypothesis import strategies as st

from rlinf.envs import ConfigError
from rlinf.envs._extras import has_module
from rlinf.envs.math import is_equivalent, normalize_answer, parse_number, warm_up_verifier

HAS_MATH_VERIFY = has_module("math_verify")
needs_math_verify = pytest.mark.skipif(not HAS_MATH_VERIFY, reason="math-verify not installed")


@pytest.mark.parametrize(
    ("text", "value"),
    [
        ("42", Fraction(42)),
        ("-0", Fraction(0)),
        ("3.0", Fraction(3)),
        ("0.5", Fraction(1, 2)),
        (".25", Fraction(1, 4)),
        ("1,234", Fraction(1234)),
        ("1,234.5", Fraction(2469, 2)),
        ("1/2", Fraction(1, 2)),
        ("-3/4", Fraction(-3, 4)),
        ("\\frac{3}{4}", Fraction(3, 4)),
        ("\\dfrac{3}{4}", Fraction(3, 4)),
        ("-\\frac{1}{2}", Fraction(-1, 2)),
        ("\\frac12", Fraction(1, 2)),
        ("\\frac{-1}{2}", Fraction(-1, 2)),
        ("-\\frac{-3}{4}", Fraction(3, 4)),
        ("$1.5$", Fraction(3, 2)),
        ("x = 5", Fraction(5)),
        ("5.", Fraction(5)),
        ("1e3", Fraction(1000)),
        ("\\$12", Fraction(12)),
        ("50\\%", Fraction(50)),
        ("10 \\text{ cm}", Fraction(10)),
        ("−2", Fraction(-2)),
    ],
)
def test_parse_number(text: str, value: Fraction) -> None:
    assert parse_number(text) == value


@pytest.mark.parametrize("text", ["", "1,2", "1,23", "abc", "1/0", "\\sqrt{2}", "(1, 2)", "2x"])
def test_parse_number_rejects_non_numbers(text: str) -> None:
    assert parse_number(text) is None


# Each case runs under both backends: exact numeric answers never reach math-verify.
NUMERIC_CASES = [
    ("1/2", "0.5", True),
    ("0.5", "\\frac{1}{2}", True),
    ("3.0", "3", True),
    ("-0", "0", True),
    ("1,000", "1000", True),
    ("0.33", "1/3", False),
    ("0.333333", "1/3", False),
    ("3.01", "3", False),
    ("-2", "2", False),
    ("2", "-2", False),
    ("1e-7", "0", False),
    # a percentage against a plain number: its value, or its value over 100
    ("50\\%", "0.5", True),
    ("50\\%", "\\frac{1}{2}", True),
    ("50%", "50", True),
    ("0.5", "50\\%", True),
    ("12.5\\%", "1/8", True),
    ("50\\%", "0.05", False),
    ("5\\%", "0.5", False),
    ("50\\%", "50\\%", True),
    ("50\\%", "0.5\\%", False),  # both percentages: compared as written
]


@pytest.mark.parametrize("backend", ["builtin", pytest.param("auto", marks=needs_math_verify)])
@pytest.mark.parametrize(("predicted", "reference", "expected"), NUMERIC_CASES)
def test_numeric_equivalence_is_exact(
    predicted: str, reference: str, expected: bool, backend: str
) -> None:
    assert is_equivalent(predicted, reference, backend=backend) is expected  # type: ignore[arg-type]


def test_builtin_fallback_compares_normalized_strings() -> None:
    assert is_equivalent("\\left(1,2\\right)", "(1, 2)", backend="builtin")
    assert is_equivalent("\\dfrac{\\pi}{2}", "\\frac{\\pi}{2}", backend="builtin")
    # Strict, not lenient: symbolic equality needs math-verify.
    assert not is_equivalent("\\sqrt{4}", "2", backend="builtin")
    assert not is_equivalent(None, "2", backend="builtin")
    assert not is_equivalent("  ", "2", backend="builtin")


def test_forced_fallback_when_math_verify_missing(monkeypatch: pytest.MonkeyPatch) -> None:
    import rlinf.envs.math.verify as verify

    monkeypatch.setattr(verify, "has_module", lambda name: False)
    assert is_equivalent("1/2", "0.5")
    assert not is_equivalent("\\sqrt{4}", "2")
    assert is_equivalent("\\{1,2\\}", "\\{1, 2\\}")


@needs_math_verify
def test_math_verify_handles_symbolic_answers() -> None:
    assert is_equivalent("\\sqrt{4}", "2")
    assert is_equivalent("\\pi/2", "\\frac{\\pi}{2}")
    assert is_equivalent("(1,2)", "(1, 2)", backend="math_verify")
    assert not is_equivalent("\\sqrt{5}", "2")


@needs_math_verify
def test_math_verify_works_off_the_main_thread() -> None:
    results: list[bool] = []
    worker = threading.Thread(target=lambda: results.append(is_equivalent("\\sqrt{4}", "2")))
    worker.start()
    worker.join()
    assert results == [True]


def test_math_verify_backend_without_extra_names_it(monkeypatch: pytest.MonkeyPatch) -> None:
    import builtins

    from rlinf.envs import MissingExtraError

    real_import = builtins.__import__

    def fake_import(name: str, *args: object, **kwargs: object) -> object:
        if name.startswith("math_verify"):
            raise ModuleNotFoundError(f"No module named {name!r}", name=name)
        return real_import(name, *args, **kwargs)  # type: ignore[arg-type]

    monkeypatch.delitem(__import__("sys").modules, "math_verify", raising=False)
    monkeypatch.setattr(builtins, "__import__", fake_import)
    with pytest.raises(MissingExtraError, match=r"rlinf-envs\[math\]"):
        is_equivalent("\\sqrt{4}", "2", backend="math_verify")


@needs_math_verify
def test_warm_up_parses_each_kind_of_answer_once_per_process(
        monkeypatch: pytest.MonkeyPatch) -> None:
    import rlinf.envs.math.verify as verify

    parsed: list[str] = []
    real = verify._math_verify_equal
    monkeypatch.setattr(verify, "_warmed", set())
    monkeypatch.setattr(verify, "_math_verify_equal",
                        lambda predicted, reference: parsed.append(predicted) or real(
                            predicted, reference))
    assert warm_up_verifier()
    assert parsed == list(verify._WARM_UP_ANSWERS)
    assert warm_up_verifier("math_verify")
    assert len(parsed) == len(verify._WARM_UP_ANSWERS)  # once per process


def test_warm_up_does_nothing_without_math_verify(monkeypatch: pytest.MonkeyPatch) -> None:
    import rlinf.envs.math.verify as verify

    monkeypatch.setattr(verify, "_warmed", set())
    assert not warm_up_verifier("builtin")
    monkeypatch.setattr(verify, "has_module", lambda name: False)
    assert not warm_up_verifier("auto")
    assert not verify._warmed
    with pytest.raises(ConfigError, match="unknown verification backend"):
        warm_up_verifier("sympy")  # type: ignore[arg-type]


def test_unknown_backend() -> None:
    with pytest.raises(ConfigError, match="unknown verification backend"):
        is_equivalent("1", "1", backend="sympy")  # type: ignore[arg-type]


def test_normalize_answer() -> None:
    assert normalize_answer(" $ x = \\dfrac{1}{2} $. ") == "\\frac{1}{2}"


@given(st.fractions(max_denominator=1000))
def test_fraction_forms_agree(value: Fraction) -> None:
    text = f"{value.numerator}/{value.denominator}"
    assert parse_number(text) == value
    latex = f"\\frac{{{abs(value.numerator)}}}{{{value.denominator}}}"
    assert parse_number(("-" if value < 0 else "") + latex) == value


@given(st.decimals(allow_nan=False, allow_infinity=False, places=4, min_value=-1e6, max_value=1e6))
def test_decimal_strings_parse_exactly(value: object) -> None:
    assert parse_number(str(value)) == Fraction(str(value))
