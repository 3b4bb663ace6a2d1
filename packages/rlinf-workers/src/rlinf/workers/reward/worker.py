"""`RewardScorer`: a run's reward functions on decoded responses, weighted and summed.

The functions (`RewardConfig.functions`) are the built-in math verifier
(`rlinf.envs.math.grade`: answer extraction, exact numbers, math-verify with a time limit)
and users' own, in the shapes of `rlinf.workers.reward.functions`: per sample, TRL's batch
shape, or veRL's ``compute_score``. They are imported in the reward worker's process (the
app also loads them at config time and calls each on a real sample before any worker
starts). An exception or a non-finite result becomes a `RewardFunctionError` naming the
function and quoting the sample.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

import torch
from transformers import PreTrainedTokenizerBase

from rlinf.envs.math import DEFAULT_TIMEOUT, grade, warm_up_verifier
from rlinf.envs.math.extract import Strategy
from rlinf.envs.math.verify import Backend
from rlinf.workers.errors import ConfigError
from rlinf.workers.reward.functions import (
    BUILTIN_MATH,
    RewardSample,
    RewardTerm,
    load_reward_terms,
)
from rlinf.workers.rollout.batch import RolloutBatch

__all__ = ["RewardConfig", "RewardScorer", "RewardStats", "call_reward_function",
           "check_reward_function"]


def call_reward_function(term: RewardTerm, sample: RewardSample) -> float:
    """`term` on one sample: its finite score, or a `RewardFunctionError` naming it and
    quoting the sample (what the app runs before launch)."""
    return term.score([sample])[0]


def check_reward_function(spec: str, sample: RewardSample | None = None) -> None:
    """Import the user's reward function `spec` and check its shape (a `ConfigError` for a
    typo or a function of no known shape) and, given a real `sample`, call it once on it (a
    `RewardFunctionError` naming it and the sample when it raises or returns no finite
    number): what a run checks before any worker starts."""
    term, = load_reward_terms((spec,), (), builtin=lambda response, answer: 0.0)
    if sample is not None:
        call_reward_function(term, sample)


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
    functions: tuple[str, ...] = (BUILTIN_MATH,)
    """The reward functions, summed with `weights`: ``math`` (the verifier above) and
    ``module:function`` names of your own, in any shape of `rlinf.workers.reward.functions`."""
    weights: tuple[float, ...] = ()
    """One weight per function (empty: 1 each)."""

    def __post_init__(self) -> None:
        if not self.strategies:
            raise ConfigError("at least one extraction strategy is needed")
        if not (self.verify_timeout > 0 and math.isfinite(self.verify_timeout)):
            raise ConfigError(f"verify_timeout must be a positive number of seconds, got "
                              f"{self.verify_timeout}")
        if not (self.verify_rel_tol >= 0 and math.isfinite(self.verify_rel_tol)):
            raise ConfigError(f"verify_rel_tol must be a finite number >= 0, got "
                              f"{self.verify_rel_tol}")
        if not all(math.isfinite(w) for w in self.weights):
            raise ConfigError(f"reward weights must be finite numbers, got {self.weights}")
        if self.weights and len(self.weights) != len(self.functions):
            raise ConfigError(f"{len(self.weights)} reward weights for {len(self.functions)} "
                              "functions: give one weight per function, or none for 1 each")

    @property
    def reads_problems(self) -> bool:
        """Whether a function of one's own is configured (they may read prompts and dataset
        columns, which the rollout then carries: `RolloutGeneratorConfig.problem_columns`)."""
        return any(spec != BUILTIN_MATH for spec in self.functions)


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
    terms: Mapping[str, float] = field(default_factory=dict)
    """Mean unweighted score of each reward function, by `RewardTerm.name`."""


class _MathVerifier:
    """The built-in reward as a per-sample function, counting the comparisons that ran out
    of time."""

    def __init__(self, config: RewardConfig) -> None:
        self.config = config
        self.timeouts = 0

    def __call__(self, response: str, answer: str) -> float:
        config = self.config
        graded = grade(response, answer, format_penalty=config.format_penalty,
                       strategies=config.strategies, backend=config.verifier,
                       timeout=config.verify_timeout, rel_tol=config.verify_rel_tol)
        self.timeouts += graded.timed_out
        return graded.reward


class RewardScorer:
    """Decodes responses and scores them with the run's reward functions."""

    def __init__(
        self, tokenizer: PreTrainedTokenizerBase, *, config: RewardConfig = RewardConfig()
    ) -> None:
        self.tokenizer = tokenizer
        self.config = config
        self._verifier = _MathVerifier(config)
        self.terms = load_reward_terms(config.functions, config.weights, builtin=self._verifier)
        if BUILTIN_MATH in config.functions and config.verifier == "math_verify":
            # Asked for by name: its helper's start-up here, not in a step. Under "auto" the
            # helper starts at the first answer a number cannot decide (numeric answers never
            # need it): warmed up at once, its imports took a core's worth of CPU from the
            # first steps of every run.
            warm_up_verifier(config.verifier)

    def decode(self, batch: RolloutBatch) -> list[str]:
        """Response texts of `batch`, padding removed. A multi-turn response is its last
        turn, after the last tool observation: what the model answered, so the tools'
        output (a calculator's result) never earns a reward by itself."""
        texts = []
        tools = (batch.tool_mask.tolist() if batch.tool_mask is not None
                 else [[False] * batch.response_ids.shape[1]] * batch.num_rows)
        for ids, mask, tool in zip(batch.response_ids.tolist(), batch.response_mask.tolist(),
                                   tools, strict=True):
            last_tool = max((i for i, t in enumerate(tool) if t), default=-1)
            valid = [t for i, (t, m) in enumerate(zip(ids, mask, strict=True))
                     if m and i > last_tool]
            texts.append(str(self.tokenizer.decode(
                valid, skip_special_tokens=self.config.skip_special_tokens)))
        return texts

    def score_texts(self, responses: Sequence[str], answers: Sequence[str]) -> torch.Tensor:
        """``[N]`` float32 rewards of response texts against reference answers."""
        if len(responses) != len(answers):
            raise ConfigError(f"got {len(responses)} responses for {len(answers)} answers")
        samples = [RewardSample(r, a) for r, a in zip(responses, answers, strict=True)]
        return self.score_samples(samples)[0]

    def score_samples(self, samples: Sequence[RewardSample]
                      ) -> tuple[torch.Tensor, dict[str, list[float]], int]:
        """``[N]`` float32 weighted rewards, each function's own scores by name, and how many
        comparisons ran past the verifier's time limit."""
        self._verifier.timeouts = 0
        scores = {term.name: term.score(samples) for term in self.terms}
        total = torch.zeros(len(samples), dtype=torch.float32)
        for term in self.terms:
            total += term.weight * torch.tensor(scores[term.name], dtype=torch.float32)
        return total, scores, self._verifier.timeouts

    def samples(self, batch: RolloutBatch) -> list[RewardSample]:
        """The responses of `batch` as reward samples, with their groups' prompts and
        columns when the batch carries them."""
        texts = self.decode(batch)
        group = batch.group_size
        return [RewardSample(text, answer,
                             batch.prompts[i // group] if batch.prompts else "",
                             batch.columns[i // group] if batch.columns else {})
                for i, (text, answer) in enumerate(zip(texts, batch.answers, strict=True))]

    def compute_rewards(self, batch: RolloutBatch) -> tuple[RolloutBatch, RewardStats]:
        """`batch` with `rewards` set, and its accuracy statistics. A response is correct
        when the math verifier scores it 1, or, without the verifier among the functions,
        when its reward reaches 1."""
        rewards, scores, timeouts = self.score_samples(self.samples(batch))
        judged = (torch.tensor(scores[BUILTIN_MATH]) if BUILTIN_MATH in scores else rewards)
        correct = judged >= 1.0
        groups = correct.reshape(-1, batch.group_size)
        count = len(rewards)
        stats = RewardStats(
            accuracy=float(correct.float().mean()) if count else 0.0,
            mean_reward=float(rewards.mean()) if count else 0.0,
            pass_at_group=float(groups.any(dim=1).float().mean()) if count else 0.0,
            responses=count,
            verify_timeouts=timeouts,
            terms={name: sum(values) / count if count else 0.0
                   for name, values in scores.items()},
        )
        return batch.replace(rewards=rewards), stats
