"""`RewardWorker`: rule-based rewards for math responses (`rlinf.envs.math.score`), or a
user's own reward function named ``module:function``.

A reward function takes ``(response, answer)`` — the decoded response text and the
reference answer — and returns a number; it is imported in the reward worker's process
(`load_reward_function`, which the app also calls at config time so a typo is refused before
any worker starts). An exception or a non-finite result becomes a `RewardFunctionError`
naming the function and quoting the sample. A veRL ``compute_score(data_source,
solution_str, ground_truth, extra_info=None)`` is wrapped in one line.
"""

from __future__ import annotations

import importlib
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import torch
from transformers import PreTrainedTokenizerBase

from rlinf.envs.math import DEFAULT_TIMEOUT, grade, warm_up_verifier
from rlinf.envs.math.extract import Strategy
from rlinf.envs.math.verify import Backend
from rlinf.workers.errors import ConfigError, RewardFunctionError
from rlinf.workers.rollout.batch import RolloutBatch

__all__ = ["RewardConfig", "RewardFunction", "RewardStats", "RewardWorker",
           "call_reward_function", "load_reward_function"]

RewardFunction = Callable[[str, str], float]
"""``(response text, reference answer) -> reward``."""

_QUOTE = 200  # characters of a sample quoted in an error


def load_reward_function(spec: str) -> RewardFunction:
    """The callable ``module:function`` names (``module.sub:attr.attr`` also works);
    ConfigError saying what is wrong otherwise."""
    module_name, sep, attr_path = spec.partition(":")
    if not sep or not module_name or not attr_path:
        raise ConfigError(f"reward function {spec!r} must read 'module:function' (e.g. "
                          "'my_rewards:exact_match')")
    try:
        target: object = importlib.import_module(module_name)
    except ImportError as exc:
        raise ConfigError(f"reward function {spec!r}: cannot import {module_name!r} ({exc}); "
                          "put the module on PYTHONPATH of every node") from exc
    for name in attr_path.split("."):
        if not hasattr(target, name):
            raise ConfigError(f"reward function {spec!r}: {module_name!r} has no "
                              f"{attr_path!r}")
        target = getattr(target, name)
    if not callable(target):
        raise ConfigError(f"reward function {spec!r} is a {type(target).__name__}, not a "
                          "function")
    return target  # type: ignore[return-value]


def call_reward_function(function: RewardFunction, name: str, response: str, answer: str, *,
                         index: int = 0) -> float:
    """`function` (the reward function called `name`) on one sample, as a finite float; a
    `RewardFunctionError` naming the function and quoting the sample when it raises or
    returns anything else."""
    sample = (f"sample {index}: response {response[:_QUOTE]!r}, answer "
              f"{answer[:_QUOTE]!r}")
    try:
        value = function(response, answer)
    except Exception as exc:
        raise RewardFunctionError(f"reward function {name!r} raised {exc!r} on "
                                  f"{sample}") from exc
    try:
        reward = float(value)
    except (TypeError, ValueError):
        reward = math.nan
    if not math.isfinite(reward):
        raise RewardFunctionError(f"reward function {name!r} returned {value!r}, not a finite "
                                  f"number, on {sample}")
    return reward


@dataclass(frozen=True)
class RewardConfig:
    """How responses are scored."""

    strategies: tuple[Strategy, ...] = ("last_number",)
    """Answer-extraction strategies of `rlinf.envs.math.extract_answer`, tried in order
    ("last_number" suits the short template's bare-number completions)."""
    format_penalty: float = 0.0
    """Reward given as ``-format_penalty`` when no answer can be extracted."""
    verifier: Backend = "auto"
    """How an extracted answer is compared with the reference (`rlinf.envs.math.is_equivalent`):
    numbers, fractions and percents exactly, then for anything else "math_verify"
    (symbolic, the math-verify package), "auto" (math-verify when installed) or "builtin"
    (string match after normalising)."""
    verify_timeout: float = DEFAULT_TIMEOUT
    """Seconds one math-verify comparison may take, in any thread; past it the response
    scores 0 and counts in `RewardStats.verify_timeouts`."""
    verify_rel_tol: float = 0.0
    """Numeric tolerance of the math verifier: 0 compares numbers exactly (`0.8660254` is
    not `\\frac{\\sqrt3}{2}`); a positive value lets a decimal answer match within that
    relative error (`rlinf.envs.math.check_answer`)."""
    skip_special_tokens: bool = True
    """Drop EOS/pad tokens when decoding responses to text."""
    function: str | None = None
    """A user's reward function, ``module:function`` taking ``(response, answer)`` and
    returning a number (module docstring); None: `rlinf.envs.math.score` with
    `strategies` and `format_penalty`."""

    def __post_init__(self) -> None:
        if not self.strategies:
            raise ConfigError("at least one extraction strategy is needed")
        if not (self.verify_timeout > 0 and math.isfinite(self.verify_timeout)):
            raise ConfigError(f"verify_timeout must be a positive number of seconds, got "
                              f"{self.verify_timeout}")
        if not (self.verify_rel_tol >= 0 and math.isfinite(self.verify_rel_tol)):
            raise ConfigError(f"verify_rel_tol must be a finite number >= 0, got "
                              f"{self.verify_rel_tol}")


@dataclass(frozen=True)
class RewardStats:
    """Accuracy of one scored batch."""

    accuracy: float
    """Share of responses whose answer is correct (reward 1)."""
    mean_reward: float
    """Mean reward over responses."""
    pass_at_group: float
    """Share of groups with at least one correct response."""
    responses: int
    """Responses scored."""
    verify_timeouts: int = 0
    """Responses whose answer math-verify did not judge within `RewardConfig.verify_timeout`
    (scored 0)."""


class RewardWorker:
    """Decodes responses and scores them against the reference answers."""

    def __init__(
        self, tokenizer: PreTrainedTokenizerBase, *, config: RewardConfig = RewardConfig()
    ) -> None:
        self.tokenizer = tokenizer
        self.config = config
        self.function = (load_reward_function(config.function)
                         if config.function is not None else None)
        if self.function is None:
            # math-verify's import and parser start-up (~0.65 s) here, not in a step.
            warm_up_verifier(config.verifier)

    def decode(self, batch: RolloutBatch) -> list[str]:
        """Response texts of `batch`, padding removed."""
        texts = []
        for ids, mask in zip(batch.response_ids.tolist(), batch.response_mask.tolist(),
                             strict=True):
            valid = [t for t, m in zip(ids, mask, strict=True) if m]
            texts.append(str(self.tokenizer.decode(
                valid, skip_special_tokens=self.config.skip_special_tokens)))
        return texts

    def score_texts(self, responses: Sequence[str], answers: Sequence[str]) -> torch.Tensor:
        """``[N]`` float32 rewards of response texts against reference answers."""
        return self._score(responses, answers)[0]

    def _score(self, responses: Sequence[str],
               answers: Sequence[str]) -> tuple[torch.Tensor, int]:
        """Rewards, and how many comparisons ran past the verifier's time limit."""
        if len(responses) != len(answers):
            raise ConfigError(f"got {len(responses)} responses for {len(answers)} answers")
        if self.function is not None:
            return torch.tensor([self._call(i, r, a) for i, (r, a) in
                                 enumerate(zip(responses, answers, strict=True))],
                                dtype=torch.float32), 0
        config = self.config
        grades = [grade(r, a, format_penalty=config.format_penalty,
                        strategies=config.strategies, backend=config.verifier,
                        timeout=config.verify_timeout, rel_tol=config.verify_rel_tol)
                  for r, a in zip(responses, answers, strict=True)]
        return (torch.tensor([g.reward for g in grades], dtype=torch.float32),
                sum(g.timed_out for g in grades))

    def _call(self, index: int, response: str, answer: str) -> float:
        """The user's function on one sample; a `RewardFunctionError` quoting it otherwise."""
        assert self.function is not None and self.config.function is not None
        return call_reward_function(self.function, self.config.function, response, answer,
                                    index=index)

    def compute_rewards(self, batch: RolloutBatch) -> tuple[RolloutBatch, RewardStats]:
        """`batch` with `rewards` set, and its accuracy statistics."""
        rewards, timeouts = self._score(self.decode(batch), batch.answers)
        correct = rewards >= 1.0
        groups = correct.reshape(-1, batch.group_size)
        stats = RewardStats(
            accuracy=float(correct.float().mean()) if len(rewards) else 0.0,
            mean_reward=float(rewards.mean()) if len(rewards) else 0.0,
            pass_at_group=float(groups.any(dim=1).float().mean()) if len(rewards) else 0.0,
            responses=len(rewards),
            verify_timeouts=timeouts,
        )
        return batch.replace(rewards=rewards), stats
