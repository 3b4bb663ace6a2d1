from __future__ import annotations

import pytest
import torch

from rlinf.workers.errors import ConfigError
from rlinf.workers.reward import RewardConfig, RewardWorker
from rlinf.workers.rollout import RolloutBatch, RolloutSample


def _batch(tokenizer, responses: list[str], answers: list[str], group_size: int) -> RolloutBatch:
    eos = tokenizer.eos_token_id
    samples = [
        RolloutSample(prompt_token_ids=tuple(tokenizer.encode("1+1=")),
                      response_token_ids=(*tokenizer.encode(text), eos),
                      log_probs=(-1.0,) * (len(text) + 1), finish_reason="stop")
        for text in responses
    ]
    return RolloutBatch.from_samples(samples, answers=answers, group_size=group_size,
                                     pad_token_id=tokenizer.pad_token_id)


def test_rewards_accuracy_and_group_pass_rate(tokenizer):
    batch = _batch(tokenizer, ["2", "3", "19", "x"], ["2", "2", "20", "20"], group_size=2)
    scored, stats = RewardWorker(tokenizer).compute_rewards(batch)
    assert scored.rewards is not None
    assert scored.rewards.tolist() == [1.0, 0.0, 0.0, 0.0]
    assert stats.accuracy == pytest.approx(0.25)
    assert stats.pass_at_group == pytest.approx(0.5)
    assert stats.responses == 4
    assert batch.rewards is None  # the input batch is not mutated


def test_decode_drops_padding_and_special_tokens(tokenizer):
    batch = _batch(tokenizer, ["12", "7"], ["12", "7"], group_size=1)
    assert RewardWorker(tokenizer).decode(batch) == ["12", "7"]


def test_format_penalty_applies_when_no_answer_is_found(tokenizer):
    worker = RewardWorker(tokenizer, config=RewardConfig(format_penalty=0.5))
    rewards = worker.score_texts(["no number here", "the answer is 4"], ["4", "4"])
    assert torch.equal(rewards, torch.tensor([-0.5, 1.0]))
    with pytest.raises(ConfigError):
        worker.score_texts(["1"], ["1", "2"])
