"""Multi-turn fields of `RolloutBatch`: built from samples, carried through channels,
cut and stacked with the rest, and the loss mask that leaves the tools' tokens out."""

from __future__ import annotations

import pytest
import torch

from rlinf.workers.errors import ConfigError, ShapeError
from rlinf.workers.models import build_char_tokenizer
from rlinf.workers.reward import RewardScorer
from rlinf.workers.rollout import RolloutBatch, RolloutSample


def _sample(model: str, tool: str, answer: str, tokenizer, *, calls: int = 1) -> RolloutSample:
    parts = [(tokenizer.encode(model, add_special_tokens=False), False),
             (tokenizer.encode(tool, add_special_tokens=False), True),
             (tokenizer.encode(answer, add_special_tokens=False), False)]
    tokens = [t for ids, _ in parts for t in ids]
    mask = [flag for ids, flag in parts for _ in ids]
    return RolloutSample(prompt_token_ids=(5, 6), response_token_ids=tuple(tokens),
                         log_probs=tuple(0.0 if m else -0.5 for m in mask), finish_reason="stop",
                         tool_mask=tuple(mask), turns=1 + calls, tool_calls=calls,
                         tool_seconds=0.25)


def _batch(tokenizer) -> RolloutBatch:
    samples = [_sample("<c>1+1</c>", "<r>2</r>", "2", tokenizer),
               _sample("<c>9</c>", "<r>9</r>", "90", tokenizer)]
    return RolloutBatch.from_samples(samples, answers=["2", "9"], group_size=1, pad_token_id=0)


def test_the_loss_mask_is_the_response_without_the_tools_tokens():
    tokenizer = build_char_tokenizer()
    batch = _batch(tokenizer)
    assert batch.multi_turn and batch.tool_mask is not None
    assert torch.equal(batch.loss_mask, batch.response_mask * ~batch.tool_mask)
    assert int(batch.tool_mask[0].sum()) == len("<r>2</r>")
    assert batch.turns.tolist() == [2, 2] and batch.tool_seconds.tolist() == [0.25, 0.25]


def test_tool_fields_travel_through_channels_selects_and_concats():
    tokenizer = build_char_tokenizer()
    batch = _batch(tokenizer)
    back = RolloutBatch.from_batch(batch.to_batch())
    assert torch.equal(back.tool_mask, batch.tool_mask) and torch.equal(back.turns, batch.turns)
    first = batch.select(slice(0, 1))
    assert first.tool_mask.shape == (1, batch.response_ids.shape[1])
    stacked = RolloutBatch.concat([batch.select(slice(1, 2)), first], pad_token_id=0)
    assert stacked.tool_calls.tolist() == [1, 1]
    assert torch.equal(stacked.loss_mask.sum(dim=1), batch.loss_mask.sum(dim=1).flip(0))
    single = RolloutBatch.from_samples(
        [RolloutSample((5,), (7,), (-1.0,), "stop")], answers=["0"], group_size=1,
        pad_token_id=0)
    assert not single.multi_turn and single.loss_mask is single.response_mask
    with pytest.raises(ConfigError, match="multi-turn batches beside single-turn"):
        RolloutBatch.concat([single, first], pad_token_id=0)


def test_multi_turn_fields_come_together():
    tokenizer = build_char_tokenizer()
    batch = _batch(tokenizer)
    with pytest.raises(ShapeError, match="come together"):
        batch.replace(turns=None)
    with pytest.raises(ConfigError, match="tool_mask has"):
        RolloutSample((1,), (2, 3), (0.0, 0.0), "stop", tool_mask=(True,))


def test_the_reward_scores_the_final_turn():
    tokenizer = build_char_tokenizer()
    rewards, _ = RewardScorer(tokenizer).compute_rewards(_batch(tokenizer))
    # Row 0 answered 2 after the tool said 2; row 1 answered 90 after the tool said 9: the
    # tool's "9" must not earn the reward.
    assert rewards.rewards.tolist() == [1.0, 0.0]
    assert RewardScorer(tokenizer).decode(_batch(tokenizer)) == ["2", "90"]
