from __future__ import annotations

import threading
from fractions import Fraction

import pytest
from hypothesis import given
from hypothesis import strategies as st

from rlinf.envs import ConfigError, VerifierError
from rlinf.envs._extras import has_module
from rlinf.envs.math import (
    Verdict,
    check_answer,
    is_equivalent,
    normalize_answer,
    parse_number,
    warm_up_verifier,
)

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

    monkeypatch.setattr(verify, "is_installed", lambda name: False)
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
    import importlib.util

    from rlinf.envs import MissingExtraError

    real_find_spec = importlib.util.find_spec

    def not_installed(name: str, *args: object, **kwargs: object) -> object:
        if name.startswith("math_verify"):
            return None
        return real_find_spec(name, *args, **kwargs)  # type: ignore[arg-type]

    # Checked without importing it (the helper process imports it, never this one).
    monkeypatch.setattr(importlib.util, "find_spec", not_installed)
    with pytest.raises(MissingExtraError, match=r"rlinf-envs\[math\]"):
        is_equivalent("\\sqrt{4}", "2", backend="math_verify")


class _FakeHelper:
    def __init__(self) -> None:
        self.starts = 0
        self.waited = 0

    def start(self, *, wait: bool = True) -> None:
        self.starts += 1
        self.waited += wait


@needs_math_verify
def test_warm_up_starts_the_helper_process(monkeypatch: pytest.MonkeyPatch) -> None:
    import rlinf.envs.math.verify as verify

    helper = _FakeHelper()
    monkeypatch.setattr(verify, "shared_process", lambda: helper)
    assert warm_up_verifier()
    assert warm_up_verifier("math_verify")
    assert helper.starts == 2  # `VerifierProcess.start` itself is idempotent
    assert helper.waited == 0  # it warms up beside the caller; the first comparison waits


def test_warm_up_does_nothing_without_math_verify(monkeypatch: pytest.MonkeyPatch) -> None:
    import rlinf.envs.math.verify as verify

    helper = _FakeHelper()
    monkeypatch.setattr(verify, "shared_process", lambda: helper)
    assert not warm_up_verifier("builtin")
    monkeypatch.setattr(verify, "is_installed", lambda name: False)
    assert not warm_up_verifier("auto")
    assert helper.starts == 0
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


@pytest.mark.parametrize("backend", ["builtin", pytest.param("auto", marks=needs_math_verify)])
@pytest.mark.parametrize(("predicted", "reference", "expected"), [
    ("y=3", "x=3", False),  # another variable
    ("x=3", "x = 3", True),
    ("x=3", "3", True),  # the reference need not name it
    ("3-", "3", False),  # malformed: math-verify alone reads it as 3
    ("\\frac{1}{2", "\\frac{1}{2}", False),
    ("\\text{(A)}\\ \\sqrt{2}", "\\sqrt{2}", True),  # a multiple-choice label is dropped
    ("\\text{(A)}", "\\text{(B)}", False),  # labels decide (not "" == "" once normalized)
])
def test_screened_and_labelled_answers(predicted: str, reference: str, expected: bool,
                                       backend: str) -> None:
    assert is_equivalent(predicted, reference, backend=backend) is expected  # type: ignore[arg-type]


@pytest.mark.parametrize("backend", ["builtin", pytest.param("auto", marks=needs_math_verify)])
def test_numeric_tolerance_applies_to_decimals_only(backend: str) -> None:
    def equal(predicted: str, reference: str, rel_tol: float) -> bool:
        return is_equivalent(predicted, reference, backend=backend,  # type: ignore[arg-type]
                             rel_tol=rel_tol)

    assert not equal("0.333333", "1/3", 0.0)
    assert equal("0.333333", "1/3", 1e-5)
    assert not equal("0.33", "1/3", 1e-5)
    assert equal("33.3333\\%", "1/3", 1e-5)  # a percentage's value over 100, within it
    assert not equal("1000001", "1000000", 1e-5)  # integers stay exact
    assert not equal("1/3", "333333/1000000", 1e-5)  # so do fractions


@needs_math_verify
def test_numeric_tolerance_of_symbolic_answers() -> None:
    # math-verify alone rounds to 6 places and would accept it: exact unless asked.
    assert not is_equivalent("0.8660254", "\\frac{\\sqrt3}{2}")
    assert is_equivalent("0.8660254", "\\frac{\\sqrt3}{2}", rel_tol=1e-6)
    assert not is_equivalent("0.866", "\\frac{\\sqrt3}{2}", rel_tol=1e-6)
    assert is_equivalent("0.5x", "\\frac{x}{2}")  # a decimal's exact value still counts


def test_options_are_checked() -> None:
    with pytest.raises(ConfigError, match="timeout"):
        is_equivalent("1", "1", timeout=0)
    with pytest.raises(ConfigError, match="rel_tol"):
        is_equivalent("1", "1", rel_tol=-1e-6)


def test_a_huge_exponent_is_not_expanded_in_process() -> None:
    assert parse_number("1e999999999") is None  # Fraction would take minutes to expand it
    assert parse_number("1e-3") == Fraction(1, 1000)
    assert not is_equivalent("1e999999999", "1", backend="builtin")


@needs_math_verify
def test_an_absurd_power_is_refused_before_math_verify(monkeypatch: pytest.MonkeyPatch) -> None:
    import rlinf.envs.math.verify as verify

    monkeypatch.setattr(verify, "shared_process", lambda: pytest.fail("reached math-verify"))
    assert check_answer("9^{9^{9^9}}", "3") is Verdict.DIFFERENT


@needs_math_verify
def test_a_pathological_answer_times_out_in_a_worker_thread() -> None:
    # The screen does not evaluate a parenthesised base, so this reaches math-verify, which
    # would compute 387420489^387420489 holding the GIL; before the helper process, a
    # thread running it never returned.
    verdicts: list[Verdict] = []
    worker = threading.Thread(
        target=lambda: verdicts.append(check_answer("(9^{9})^{9^{9}}", "3", timeout=1.0)),
        daemon=True)
    worker.start()
    worker.join(timeout=120)  # generous: a helper's start on a busy host, then 1 s
    assert not worker.is_alive()
    assert verdicts == [Verdict.TIMED_OUT]
    assert is_equivalent("\\sqrt{4}", "2")  # a fresh helper answers the next comparison


class _FailingHelper(_FakeHelper):
    def compare(self, predicted: str, reference: str, *, rel_tol: float,
                timeout: float) -> bool | None:
        raise VerifierError("math-verify failed on odd LaTeX")


@needs_math_verify
def test_a_math_verify_failure_falls_back_under_auto_only(
        monkeypatch: pytest.MonkeyPatch) -> None:
    import rlinf.envs.math.verify as verify

    monkeypatch.setattr(verify, "shared_process", _FailingHelper)
    assert is_equivalent("\\sqrt{4}", "\\sqrt{ 4 }")  # normalized strings
    assert not is_equivalent("\\sqrt{4}", "2")
    with pytest.raises(VerifierError, match="odd LaTeX"):
        is_equivalent("\\sqrt{4}", "2", backend="math_verify")
