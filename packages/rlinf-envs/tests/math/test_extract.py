from __future__ import annotations

import pytest

from rlinf.envs import ConfigError
from rlinf.envs.math import (
    extract_answer,
    extract_boxed,
    extract_hash_answer,
    extract_last_number,
    extract_phrase_answer,
)


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("so \\boxed{42}.", "42"),
        ("\\boxed{\\frac{1}{2}}", "\\frac{1}{2}"),
        ("nested \\boxed{\\frac{\\sqrt{3}}{2}} end", "\\frac{\\sqrt{3}}{2}"),
        ("first \\boxed{1} then \\boxed{2}", "2"),
        ("set \\boxed{\\{1, 2\\}}", "\\{1, 2\\}"),
        ("\\fbox{7}", "7"),
        ("brace-less \\boxed 5 done", "5"),
        ("good \\boxed{3} then broken \\boxed{4", "3"),
        ("no box here", None),
        ("\\boxed{", None),
    ],
)
def test_extract_boxed(text: str, expected: str | None) -> None:
    assert extract_boxed(text) == expected


def test_extract_hash_answer_takes_last_marker_and_its_line() -> None:
    assert extract_hash_answer("work\n#### 12\nmore\n#### 72\ntrailing") == "72"
    assert extract_hash_answer("#### ") is None
    assert extract_hash_answer("none") is None


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("The answer is 42.", "42"),
        ("so the final answer is: $3.5$.", "3.5"),
        ("Answer: -7", "-7"),
        ("The answer is 1. Then the answer is 2.", "2"),
        ("The answer is \\boxed{9}.", "9"),
        ("nothing", None),
    ],
)
def test_extract_phrase_answer(text: str, expected: str | None) -> None:
    assert extract_phrase_answer(text) == expected


def test_extract_last_number_reads_only_final_line() -> None:
    assert extract_last_number("3 apples\nthen 4 and 1,234") == "1,234"
    assert extract_last_number("19") == "19"
    assert extract_last_number("-3/4") == "-3/4"
    assert extract_last_number("12\nno digits") is None
    assert extract_last_number("  \n ") is None


def test_extract_answer_order_and_strategies() -> None:
    text = "The answer is 5.\n#### 6\n\\boxed{7}\n8"
    assert extract_answer(text) == "7"
    assert extract_answer(text, strategies=("hash", "boxed")) == "6"
    assert extract_answer(text, strategies=("phrase",)) == "5"
    assert extract_answer(text, strategies=("last_number",)) == "8"
    assert extract_answer("nothing", strategies=("boxed",)) is None
    with pytest.raises(ConfigError, match="unknown extraction strategy"):
        extract_answer(text, strategies=("bogus",))  # type: ignore[arg-type]
