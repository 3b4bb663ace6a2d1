from __future__ import annotations

import threading

import pytest

from rlinf.envs import ConfigError
from rlinf.envs._extras import has_module
from rlinf.envs.math import Grade, Verdict, grade, score, score_batch


@pytest.mark.parametrize(
    ("response", "answer", "expected"),
    [
        ("Thus \\boxed{\\frac{1}{2}}.", "0.5", 1.0),
        ("#### 72", "72", 1.0),
        ("The answer is 3.0.", "3", 1.0),
        ("I think 7\nso 8", "8", 1.0),
        ("\\boxed{9}", "8", 0.0),
        ("The answer is 0.33", "1/3", 0.0),
        ("So the share is \\boxed{50\\%}.", "0.5", 1.0),  # a percentage against a fraction
        ("So the share is \\boxed{5\\%}.", "0.5", 0.0),
    ],
)
def test_score(response: str, answer: str, expected: float) -> None:
    assert score(response, answer, backend="builtin") == expected


def test_format_penalty_only_when_nothing_extractable() -> None:
    assert score("no idea", "3") == 0.0
    assert score("no idea", "3", format_penalty=0.5) == -0.5
    assert score("\\boxed{4}", "3", format_penalty=0.5) == 0.0
    # Short-template models: only the bare number counts, a box is not required.
    assert score("19", "19", strategies=("last_number",)) == 1.0
    assert score("The answer is 19", "19", strategies=("boxed",), format_penalty=1.0) == -1.0
    with pytest.raises(ConfigError):
        score("1", "1", format_penalty=-1)


def test_score_batch() -> None:
    assert score_batch(["\\boxed{1}", "2"], ["1", "3"]) == [1.0, 0.0]
    with pytest.raises(ConfigError, match="align"):
        score_batch(["1"], [])


needs_math_verify = pytest.mark.skipif(not has_module("math_verify"),
                                       reason="math-verify not installed")
BACKENDS = ["builtin", pytest.param("auto", marks=needs_math_verify)]


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize(("response", "answer", "expected"), [
    ("\\boxed{\\text{(A)}\\ \\sqrt{2}}", "\\sqrt{2}", 1.0),  # a choice's label is dropped
    ("\\boxed{y=3}", "x=3", 0.0),  # another variable
    ("\\boxed{3-}", "3", 0.0),  # malformed
])
def test_verdicts_of_issue_43(response: str, answer: str, expected: float,
                              backend: str) -> None:
    assert score(response, answer, backend=backend) == expected  # type: ignore[arg-type]


@needs_math_verify
def test_decimals_are_exact_unless_a_tolerance_is_set() -> None:
    response, answer = "The answer is 0.8660254", "\\frac{\\sqrt3}{2}"
    assert score(response, answer) == 0.0
    assert score(response, answer, rel_tol=1e-6) == 1.0
    assert score("The answer is 0.866", answer, rel_tol=1e-6) == 0.0
    assert score_batch([response], [answer], rel_tol=1e-6) == [1.0]


@pytest.mark.parametrize("backend", BACKENDS)
def test_multiple_choice_by_label_and_content(backend: str) -> None:
    def scored(response: str, answer: str, **kwargs: object) -> float:
        return score(response, answer, backend=backend, **kwargs)  # type: ignore[arg-type]

    assert scored("\\boxed{(A)}", "A") == 1.0
    assert scored("\\boxed{A}", "(A)") == 1.0
    assert scored("\\boxed{\\text{(A)} \\sqrt2}", "A") == 1.0
    assert scored("\\boxed{\\text{(B)} \\sqrt2}", "A") == 0.0
    assert scored("\\boxed{\\sqrt2}", "(A) \\sqrt2") == 1.0  # the option's content
    choices = {"A": "\\sqrt2", "B": "2"}
    assert scored("\\boxed{\\sqrt2}", "A", choices=choices) == 1.0
    assert scored("\\boxed{2}", "A", choices=choices) == 0.0
    assert scored("\\boxed{\\sqrt2}", "A") == 0.0  # without the options: unknown content


def test_grade_says_why() -> None:
    assert grade("\\boxed{4}", "4", backend="builtin") == Grade(1.0, Verdict.EQUAL)
    assert grade("\\boxed{5}", "4", backend="builtin") == Grade(0.0, Verdict.DIFFERENT)
    assert grade("nothing", "4", format_penalty=0.5) == Grade(-0.5, None)
    assert not grade("nothing", "4").timed_out


@needs_math_verify
def test_a_pathological_answer_scores_zero_within_its_limit_in_a_thread() -> None:
    grades: list[Grade] = []
    worker = threading.Thread(target=lambda: grades.append(
        grade("So \\boxed{(9^{9})^{9^{9}}}", "3", timeout=1.0)), daemon=True)
    worker.start()
    worker.join(timeout=120)  # generous: a helper's start on a busy host, then 1 s
    assert not worker.is_alive()
    assert [(g.reward, g.timed_out) for g in grades] == [(0.0, True)]
    # The issue's own answer is refused before math-verify, without a timeout.
    assert grade("\\boxed{9^{9^{9^9}}}", "3") == Grade(0.0, Verdict.DIFFERENT)
