"""Rule-based reward for math responses."""

from __future__ import annotations

from collections.abc import Sequence

from rlinf.envs.errors import ConfigError
from rlinf.envs.math.extract import ALL_STRATEGIES, Strategy, extract_answer
from rlinf.envs.math.verify import Backend, is_equivalent


def score(
    response: str,
    answer: str,
    *,
    format_penalty: float = 0.0,
    strategies: Sequence[Strategy] = ALL_STRATEGIES,
    backend: Backend = "auto",
) -> float:
    """1.0 if the final answer in `response` equals `answer`, else 0.0.

    `answer` is the reference final answer (`MathProblem.answer`). When no answer can be
    extracted with `strategies`, the reward is `-format_penalty` (0.0 by default), so a
    policy can be pushed toward the expected format. For tiny models trained on the short
    template ("12+7=" → "19") pass `strategies=("last_number",)`.
    """
    if format_penalty < 0:
        raise ConfigError(f"format_penalty must be >= 0, got {format_penalty}")
    predicted = extract_answer(response, strategies=strategies)
    if predicted is None:
        return -format_penalty if format_penalty else 0.0
    return 1.0 if is_equivalent(predicted, answer, backend=backend) else 0.0


def score_batch(
    responses: Sequence[str],
    answers: Sequence[str],
    *,
    format_penalty: float = 0.0,
    strategies: Sequence[Strategy] = ALL_STRATEGIES,
    backend: Backend = "auto",
) -> list[float]:
    """`score` over aligned sequences of responses and reference answers."""
    if len(responses) != len(answers):
        raise ConfigError(
            f"responses and answers must align; got {len(responses)} and {len(answers)}"
        )
    return [
        score(r, a, format_penalty=format_penalty, strategies=strategies, backend=backend)
        for r, a in zip(responses, answers, strict=True)
    ]
