"""Rule-based reward for math responses."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from rlinf.envs.errors import ConfigError
from rlinf.envs.math.extract import ALL_STRATEGIES, Strategy, extract_answer
from rlinf.envs.math.verify import DEFAULT_TIMEOUT, Backend, Verdict, check_answer


@dataclass(frozen=True)
class Grade:
    """The reward of one response and how its answer was judged."""

    reward: float
    """1.0 correct, 0.0 wrong or undecided, ``-format_penalty`` when nothing was extracted."""
    verdict: Verdict | None
    """`check_answer`'s verdict; None when no answer could be extracted."""

    @property
    def timed_out(self) -> bool:
        """Whether the comparison ran past its time limit (and so scored 0)."""
        return self.verdict is Verdict.TIMED_OUT


def grade(
    response: str,
    answer: str,
    *,
    format_penalty: float = 0.0,
    strategies: Sequence[Strategy] = ALL_STRATEGIES,
    backend: Backend = "auto",
    timeout: float = DEFAULT_TIMEOUT,
    rel_tol: float = 0.0,
    choices: Mapping[str, str] | None = None,
) -> Grade:
    """`score` with the verdict behind it (`Grade.timed_out` for counting time-outs)."""
    if format_penalty < 0:
        raise ConfigError(f"format_penalty must be >= 0, got {format_penalty}")
    predicted = extract_answer(response, strategies=strategies)
    if predicted is None:
        return Grade(-format_penalty if format_penalty else 0.0, None)
    verdict = check_answer(predicted, answer, backend=backend, timeout=timeout,
                           rel_tol=rel_tol, choices=choices)
    return Grade(1.0 if verdict is Verdict.EQUAL else 0.0, verdict)


def score(
    response: str,
    answer: str,
    *,
    format_penalty: float = 0.0,
    strategies: Sequence[Strategy] = ALL_STRATEGIES,
    backend: Backend = "auto",
    timeout: float = DEFAULT_TIMEOUT,
    rel_tol: float = 0.0,
    choices: Mapping[str, str] | None = None,
) -> float:
    """1.0 if the final answer in `response` equals `answer`, else 0.0.

    `answer` is the reference final answer (`MathProblem.answer`). When no answer can be
    extracted with `strategies`, the reward is `-format_penalty` (0.0 by default), so a
    policy can be pushed toward the expected format. For tiny models trained on the short
    template ("12+7=" → "19") pass `strategies=("last_number",)`. `timeout`, `rel_tol` and
    `choices` are `rlinf.envs.math.check_answer`'s; a comparison past `timeout` scores 0.
    """
    return grade(response, answer, format_penalty=format_penalty, strategies=strategies,
                 backend=backend, timeout=timeout, rel_tol=rel_tol, choices=choices).reward


def score_batch(
    responses: Sequence[str],
    answers: Sequence[str],
    *,
    format_penalty: float = 0.0,
    strategies: Sequence[Strategy] = ALL_STRATEGIES,
    backend: Backend = "auto",
    timeout: float = DEFAULT_TIMEOUT,
    rel_tol: float = 0.0,
) -> list[float]:
    """`score` over aligned sequences of responses and reference answers."""
    if len(responses) != len(answers):
        raise ConfigError(
            f"responses and answers must align; got {len(responses)} and {len(answers)}"
        )
    return [
        score(r, a, format_penalty=format_penalty, strategies=strategies, backend=backend,
              timeout=timeout, rel_tol=rel_tol)
        for r, a in zip(responses, answers, strict=True)
    ]
