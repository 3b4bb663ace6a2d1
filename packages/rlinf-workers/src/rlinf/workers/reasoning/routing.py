"""Which rank handles which group, and how a group travels through a channel.

Every group of an iteration has an index ``0..G-1`` (prompt order). Rollout micro-batch
``k`` (``groups_per_micro_batch`` consecutive groups) goes to rollout rank ``k % R``; group
``i`` goes to reward rank ``i % W``, inference rank ``i % I`` and to the actor rank whose
contiguous shard holds it. Because the routing is a function of the index alone, every
consumer knows how many groups it will receive, channels can address ranks by key
(``"r0"``, ``"r1"``, ...), and the result of an iteration does not depend on timing.
"""

from __future__ import annotations

from dataclasses import dataclass

from rlinf.comm import Batch
from rlinf.workers.errors import ConfigError
from rlinf.workers.flow.channels import rank_key
from rlinf.workers.rollout.batch import RolloutBatch

__all__ = ["Routing", "pack_group", "rank_key", "unpack_group"]


@dataclass(frozen=True)
class Routing:
    """The assignment of one iteration's groups to ranks (see the module docstring)."""

    groups: int
    """Groups in the iteration (prompts)."""
    groups_per_micro_batch: int
    """Groups the rollout generates together."""
    group_size: int
    """Responses per group (the channel weight of one group)."""
    rollout_ranks: int
    """Ranks of the rollout role."""
    reward_ranks: int
    """Ranks of the reward role."""
    inference_ranks: int
    """Ranks of the inference role (0: no inference role)."""
    actor_ranks: int
    """Ranks of the actor role."""

    def __post_init__(self) -> None:
        if min(self.groups, self.groups_per_micro_batch, self.group_size) < 1:
            raise ConfigError(f"an iteration needs >= 1 group, groups_per_micro_batch >= 1 and "
                              f"group_size >= 1, got {self.groups}, "
                              f"{self.groups_per_micro_batch} and {self.group_size}")
        if min(self.rollout_ranks, self.reward_ranks, self.actor_ranks) < 1 or \
                self.inference_ranks < 0:
            raise ConfigError("every role needs >= 1 rank (inference may have 0)")
        if self.groups < self.actor_ranks:
            raise ConfigError(f"{self.groups} groups cannot feed {self.actor_ranks} actor ranks "
                              "(each data-parallel rank needs >= 1 group): use more prompts "
                              "per step or fewer actor devices")

    @property
    def micro_batches(self) -> int:
        """Rollout micro-batches in the iteration."""
        return -(-self.groups // self.groups_per_micro_batch)

    def micro_batch_groups(self, k: int) -> range:
        """Group indices of rollout micro-batch `k`."""
        start = k * self.groups_per_micro_batch
        return range(start, min(start + self.groups_per_micro_batch, self.groups))

    def rollout_micro_batches(self, rank: int) -> list[int]:
        """Micro-batches rollout `rank` generates, in order."""
        return list(range(rank, self.micro_batches, self.rollout_ranks))

    def reward_rank(self, index: int) -> int:
        """Reward rank of group `index`."""
        return index % self.reward_ranks

    def inference_rank(self, index: int) -> int:
        """Inference rank of group `index`."""
        return index % self.inference_ranks

    def actor_rank(self, index: int) -> int:
        """Actor rank whose contiguous shard holds group `index`."""
        for rank in range(self.actor_ranks):
            if index < self.actor_shard(rank).stop:
                return rank
        raise ConfigError(f"group {index} is outside the iteration's {self.groups} groups")

    def actor_shard(self, rank: int) -> range:
        """Groups of actor `rank` (``torch.tensor_split``'s rule: the first ranks get one more)."""
        base, extra = divmod(self.groups, self.actor_ranks)
        start = rank * base + min(rank, extra)
        return range(start, start + base + (1 if rank < extra else 0))

    def count(self, role: str, rank: int) -> int:
        """Groups `rank` of `role` ("reward", "inference", "actor") receives."""
        if role == "actor":
            return len(self.actor_shard(rank))
        ranks = {"reward": self.reward_ranks, "inference": self.inference_ranks}.get(role)
        if ranks is None:
            raise ConfigError(f"no routing for role {role!r}")
        return len(range(rank, self.groups, ranks))


def pack_group(group: RolloutBatch, *, index: int, step: int) -> Batch:
    """The channel item of one group: its tensors plus its index and iteration."""
    batch = group.to_batch()
    return Batch(batch.tensors, meta={**batch.meta, "index": index, "step": step})


def unpack_group(item: Batch, *, step: int) -> tuple[int, RolloutBatch]:
    """``(index, group)`` of a channel item; the tensors are copied out of shared memory."""
    if int(item.meta.get("step", -1)) != step:
        raise ConfigError(f"received a group of iteration {item.meta.get('step')} while "
                          f"running iteration {step}: a previous iteration left items behind")
    group = RolloutBatch.from_batch(item)
    owned = {name: value.clone() for name, value in vars(group).items()
             if hasattr(value, "clone")}
    return int(item.meta["index"]), group.replace(**owned)
