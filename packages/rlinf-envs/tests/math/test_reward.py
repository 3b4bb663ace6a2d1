from __future__ import annotations

import pytest

from rlinf.envs import ConfigError
from rlinf.envs.math import score, score_batch


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
