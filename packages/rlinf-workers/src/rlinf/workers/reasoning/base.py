"""`ReasoningRole`: what the rollout, reward, inference and actor roles share.

A `rlinf.workers.flow.FlowWorker` (device turns through the run's device lock, channels,
busy time, trace spans, the flow runtime's entry call) plus what the reasoning roles add:

- `RoleSetup` (model factory, seed, device, precision, timeouts);
- torch threads = the rank's device count on CPU (a CPU slot is one core; `FlowWorker`
  keeps them at every turn);
- `receive_shard`: this rank's groups of an iteration from a `FlowChannel`, a message at a
  time.

Rule that keeps collocated placements deadlock-free: a role never waits on a channel while
holding its devices; it takes an input first, then the devices.
"""

from __future__ import annotations

from collections.abc import Iterator

import torch

from rlinf.workers.errors import ConfigError
from rlinf.workers.flow import FlowChannel, FlowWorker, StepContext
from rlinf.workers.flow.channels import rank_key
from rlinf.workers.reasoning.groups import unpack_group
from rlinf.workers.reasoning.setup import RoleSetup
from rlinf.workers.rollout.batch import RolloutBatch
from rlinf.workers.runtime import WorkerContext

__all__ = ["ReasoningRole"]


class ReasoningRole(FlowWorker):
    """Base of the reasoning roles (see the module docstring)."""

    def __init__(self, context: WorkerContext, *, setup: RoleSetup) -> None:
        super().__init__(context, lock_timeout=setup.lock_timeout, io_timeout=setup.io_timeout,
                         num_threads=(max(len(context.devices), 1) if setup.device == "cpu"
                                      else None))
        self.setup = setup
        self.device = self._torch_device()

    def _torch_device(self) -> torch.device:
        if self.setup.device == "cpu":
            return torch.device("cpu")
        if not torch.cuda.is_available():
            raise ConfigError(f"{self!r} was placed with device='cuda' but sees no GPU; "
                              "launch it with num_gpus_per_rank > 0 or use device='cpu'")
        return torch.device("cuda", torch.cuda.current_device())

    # -- channels --------------------------------------------------------------------------

    def receive_shard(self, ctx: StepContext, channel: FlowChannel
                      ) -> Iterator[list[tuple[int, RolloutBatch]]]:
        """Flow entries: this rank's share of iteration ``ctx.step``'s units on `channel`,
        in the channel's messages (see `receive`)."""
        total = channel.units(ctx.items[self.role])
        return self.receive(channel, step=ctx.step, count=len(channel.indices(self.rank, total)),
                            group_size=channel.unit, granularity=channel.units_per_message)

    def receive(self, channel: FlowChannel, *, step: int, count: int, group_size: int,
                granularity: int) -> Iterator[list[tuple[int, RolloutBatch]]]:
        """This rank's `count` groups of iteration `step` from `channel`, in messages of up
        to `granularity` groups (``(index, group)`` pairs, in arrival order)."""
        handle = self.channel(channel)
        left = count
        while left > 0:
            take = min(max(granularity, 1), left)
            items = handle.get_batch(target_weight=take * group_size,
                                     key=rank_key(self.rank), timeout=self.setup.io_timeout)
            yield [unpack_group(item, step=step) for item in items]
            left -= len(items)
