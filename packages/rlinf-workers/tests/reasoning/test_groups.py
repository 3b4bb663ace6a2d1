"""Rollout micro-batches, the seeding rule, and the channel item of a group."""

from __future__ import annotations

import pytest
import torch

from rlinf.workers.errors import ConfigError
from rlinf.workers.reasoning import MicroBatches, draw_seed, pack_group, unpack_group
from rlinf.workers.rollout import RolloutBatch


def test_micro_batches_cover_every_group_once_whatever_the_ranks() -> None:
    plan = MicroBatches(groups=7, groups_per_micro_batch=2, ranks=2)
    assert plan.count == 4
    generated = [i for rank in range(2) for k in plan.of_rank(rank) for i in plan.groups_of(k)]
    assert sorted(generated) == list(range(7))
    assert plan.of_rank(1) == [1, 3]
    with pytest.raises(ConfigError, match="groups_per_micro_batch"):
        MicroBatches(groups=2, groups_per_micro_batch=0, ranks=1)
    with pytest.raises(ConfigError, match="outside"):
        plan.of_rank(2)


def test_draw_seed_is_a_pure_function_of_its_arguments() -> None:
    assert draw_seed(3, 5, 7) == draw_seed(3, 5, 7)
    seeds = {draw_seed(3, s, i, purpose=p) for s in range(4) for i in range(4) for p in range(2)}
    assert len(seeds) == 32
    assert all(0 <= seed < 2**63 for seed in seeds)
    assert draw_seed(3, 1, 2) != draw_seed(4, 1, 2)
    with pytest.raises(ConfigError):
        draw_seed(0, -1, 0)


def _group() -> RolloutBatch:
    return RolloutBatch(
        prompt_ids=torch.tensor([[5, 6], [5, 6]]), prompt_mask=torch.ones(2, 2, dtype=torch.long),
        response_ids=torch.tensor([[7, 2], [8, 0]]), response_mask=torch.tensor([[1, 1], [1, 0]]),
        rollout_log_probs=torch.tensor([[-0.5, -0.25], [-1.0, 0.0]]),
        stopped=torch.tensor([True, False]), answers=("3", "3"), group_size=2,
        rewards=torch.tensor([1.0, 0.0]))


def test_a_group_round_trips_through_its_channel_item() -> None:
    item = pack_group(_group(), index=4, step=9)
    assert item.meta["index"] == 4 and item.meta["step"] == 9
    index, group = unpack_group(item, step=9)
    assert index == 4
    torch.testing.assert_close(group.rollout_log_probs, _group().rollout_log_probs)
    torch.testing.assert_close(group.rewards, _group().rewards)
    assert group.answers == ("3", "3")
    with pytest.raises(ConfigError, match="iteration 9"):
        unpack_group(item, step=10)
