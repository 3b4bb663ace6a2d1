"""`RewardWorker`: rule-based rewards for math responses (`rlinf.envs.math.score`)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch
from transformers import PreTrainedTokenizerBase

from rlinf.envs.math import score
from rlinf.envs.math.extract import Strategy
from rlinf.workers.errors import ConfigError
from rlinf.workers.rollout.batch import RolloutBatch

__all__ = ["RewardConfig", "RewardStats", "RewardWorker"]


@dataclass(frozen=True)
class RewardConfig:
    """How responses are scored."""

    strategies: tuple[Strategy, ...] = ("last_number",)
    """Answer-extraction strategies of `rlinf.envs.math.extract_answer`, tried in order
    ("last_number" suits the short template's bare-number completions)."""
    format_penalty: float = 0.0
    """Reward given as ``-format_penalty`` when no answer can be extracted."""
    skip_special_tokens: bool = True
    """Drop EOS/pad tokens when decoding responses to text."""

    def __post_init__(self) -> None:
        if not self.strategies:
            raise ConfigError("at least one extraction strategy is needed")


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


class RewardWorker:
    """Decodes responses and scores them against the reference answers."""

    def __init__(
        self, tokenizer: PreTrainedTokenizerBase, *, config: RewardConfig = RewardConfig()
    ) -> None:
        self.tokenizer = tokenizer
        self.config = config

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
        if len(responses) != len(answers):
            raise ConfigError(f"got {len(responses)} responses for {len(answers)} answers")
        return torch.tensor([
            score(r, a, format_penalty=self.config.format_penalty,
                  strategies=self.config.strategies)
            for r, a in zip(responses, answers, strict=True)
        ], dtype=torch.float32)

    def compute_rewards(self, batch: RolloutBatch) -> tuple[RolloutBatch, RewardStats]:
        """`batch` with `rewards` set, and its accuracy statistics."""
        rewards = self.score_texts(self.decode(batch), batch.answers)
        correct = rewards >= 1.0
        groups = correct.reshape(-1, batch.group_size)
        stats = RewardStats(
            accuracy=float(correct.float().mean()) if len(rewards) else 0.0,
            mean_reward=float(rewards.mean()) if len(rewards) else 0.0,
            pass_at_group=float(groups.any(dim=1).float().mean()) if len(rewards) else 0.0,
            responses=len(rewards),
        )
        return batch.replace(rewards=rewards), stats
