"""`ActorRole`: collects its shard of an iteration's groups, trains, and serves weights.

Groups arrive in any order; the role sorts them by index and trains on their concatenation,
so the optimizer sees the same batch whatever the placement and timing. The optimizer steps
only once every group of the shard arrived (``ActorConfig`` decides how many steps follow).
With ``ActorConfig.policy_lag=1`` (the flow's trainer one iteration behind) every batch's
old log-probs are recomputed here, under the weights before this update (decoupled PPO's
proximal policy); the rollout's own log-probs stay the sampling policy's, weighed against
them by the rollout correction.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Iterator
from pathlib import Path
from typing import ClassVar

import torch

from rlinf.workers.actor import ActorConfig, PolicyTrainer
from rlinf.workers.actor.megatron.layout import MegatronConfig
from rlinf.workers.errors import ConfigError
from rlinf.workers.flow import FlowChannel, Sharding, StepContext
from rlinf.workers.reasoning.setup import RoleSetup
from rlinf.workers.reasoning.sync import WeightSenderRole
from rlinf.workers.rollout.batch import RolloutBatch
from rlinf.workers.rollout.offload import state_bytes
from rlinf.workers.runtime import WorkerContext
from rlinf.workers.runtime.distributed import join_process_group
from rlinf.workers.weight_sync import Bucket

__all__ = ["ActorRole"]


class ActorRole(WeightSenderRole):
    """Actor rank (see the module docstring). Call `build` after the group's process group
    is up (DDP/FSDP2 wrap the model at construction)."""

    input_sharding: ClassVar[Sharding] = "contiguous"
    """Each data-parallel rank trains one contiguous shard of the iteration's groups."""

    def __init__(self, context: WorkerContext, *, setup: RoleSetup, config: ActorConfig,
                 bucket_bytes: int = 64 << 20, stream: bool = True,
                 megatron: MegatronConfig | None = None) -> None:
        """With `megatron` the trainer is a `MegatronActor` cut by its tensor and pipeline
        degrees (the actor's ranks are their multiple); otherwise an `PolicyTrainer` wrapped
        per ``config.parallelism``."""
        super().__init__(context, setup=setup)
        self.config = config
        self.megatron = megatron
        self.bucket_bytes = bucket_bytes
        self.stream = stream
        self._actor: PolicyTrainer | None = None
        self._pad_id = 0

    def build(self) -> None:
        """Construct the trainer (wrapping the model for data parallelism if distributed)."""
        model, tokenizer = self.setup.model_factory()
        self._pad_id = int(tokenizer.pad_token_id)
        if self.megatron is not None:
            from rlinf.workers.actor.megatron import MegatronActor

            _join_group_of_one(self.device)
            self._actor = MegatronActor(model, config=self.config, megatron=self.megatron,
                                        device=self.device, seed=self.setup.seed)
        else:
            self._actor = PolicyTrainer(model, config=self.config, device=self.device)
        self.offload()  # components start offloaded: the first turn onloads

    @property
    def actor(self) -> PolicyTrainer:
        """The trainer; ConfigError before `build`."""
        if self._actor is None:
            raise ConfigError("ActorRole.build() must run before the actor is used")
        return self._actor

    # -- training --------------------------------------------------------------------------

    def train_step(self, ctx: StepContext, *, input_channel: FlowChannel) -> dict[str, float]:
        """Flow entry (`rlinf.workers.flow`): train on this rank's contiguous shard of
        iteration ``ctx.step``, in group-index order.

        It streams where it can (`stream`, `PolicyTrainer.can_stream`) and no device of the
        actor is shared with a source component (the rollout holds a shared device for its
        whole generation, so there is nothing to overlap): the gradients of each micro-batch
        (``micro_batch_size`` rows of consecutive groups, at least one group) are computed as
        soon as its groups arrived, one device turn each, and the optimizer steps once after
        the last. Otherwise the shard is collected first and trained in one turn. Either way
        the micro-batches are the same whatever the placement, so the result is too."""
        if input_channel.sharding != "contiguous":
            raise ConfigError(f"the actor trains a contiguous shard, but channel "
                              f"{input_channel.edge} splits its units {input_channel.sharding}")
        total = input_channel.units(ctx.items[self.role])
        stream = self.stream and not any(ctx.shares_devices(self.role, source)
                                         for source in ctx.sources)
        return self._train(ctx.step, input_channel, shard=input_channel.indices(self.rank, total),
                           group_size=input_channel.unit,
                           granularity=input_channel.units_per_message, stream=stream)

    def _collect(self, step: int, channel: FlowChannel, *, shard: range, group_size: int,
                 granularity: int) -> RolloutBatch:
        received: dict[int, RolloutBatch] = {}
        for message in self.receive(channel, step=step, count=len(shard),
                                    group_size=group_size, granularity=granularity):
            self._file(message, received, shard)
        return RolloutBatch.concat([received[i] for i in shard], pad_token_id=self._pad_id)

    def _file(self, message: list[tuple[int, RolloutBatch]], received: dict[int, RolloutBatch],
              shard: range) -> None:
        """Keep a message's groups by index; each of the shard's groups arrives once."""
        for index, group in message:
            if index not in shard or index in received:
                raise ConfigError(f"actor rank {self.rank} got group {index}, expected "
                                  f"each of {shard.start}..{shard.stop - 1} once")
            received[index] = group

    def _train(self, step: int, channel: FlowChannel, *, shard: range, group_size: int,
               granularity: int, stream: bool) -> dict[str, float]:
        actor = self.actor  # fail before consuming the shard if build() did not run
        if not (stream and actor.can_stream):
            batch = self._collect(step, channel, shard=shard, group_size=group_size,
                                  granularity=granularity)
            self._all_collected()
            batch = actor.training_batch(batch, pad_token_id=self._pad_id)
            return self.train_batch(self._proximal(batch), step=step)
        size = max(1, self.config.micro_batch_size // group_size)
        chunks = [range(start, min(start + size, shard.stop))
                  for start in range(shard.start, shard.stop, size)]
        received: dict[int, RolloutBatch] = {}
        units, done = 0.0, 0
        sums: dict[str, float] = {}
        for message in self.receive(channel, step=step, count=len(shard),
                                    group_size=group_size, granularity=granularity):
            self._file(message, received, shard)
            while done < len(chunks) and all(i in received for i in chunks[done]):
                batch = self._proximal(RolloutBatch.concat([received[i] for i in chunks[done]],
                                                            pad_token_id=self._pad_id))
                with self.turn("train_micro_batch", step=step, index=done,
                               rows=batch.num_rows), self.timed_call(batch.num_rows):
                    part, metrics = actor.accumulate(batch)
                units += part
                for key, value in metrics.items():
                    sums[key] = sums.get(key, 0.0) + value
                done += 1
        # Collectives run outside device turns: a peer rank may still need this device
        # (through the roles that feed it) before it can join.
        units, sums = actor.reduce_accumulated(units, sums)
        with self.turn("optimizer_step", step=step):
            return actor.step_accumulated(units, sums)

    def _proximal(self, batch: RolloutBatch) -> RolloutBatch:
        """Under a policy lag, `batch` with its old log-probs under this trainer's weights
        before the update (the module docstring); unchanged without one. Streaming computes
        it per micro-batch: the weights change only at the optimizer step after the last."""
        if not self.config.policy_lag:
            return batch
        return dataclasses.replace(batch, old_log_probs=self.log_probs(batch))

    def _all_collected(self) -> None:
        """Wait (holding no device) until every actor rank has its shard: training runs DDP
        collectives inside a device turn, and a rank still waiting for its groups may need
        the very device a peer would hold while blocked in that collective."""
        import torch.distributed as dist

        if dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1:
            dist.barrier()

    def train_batch(self, batch: RolloutBatch, *, step: int = -1) -> dict[str, float]:
        """Train on `batch` in one device turn; returns the trainer's metrics."""
        with self.turn("train", step=step, rows=batch.num_rows), \
                self.timed_call(batch.num_rows):
            return self.actor.train(batch)

    def profile_train(self, batch: RolloutBatch) -> float:
        """Seconds to train on `batch`; model, optimizer and step are restored afterwards,
        so profiling never changes the training trajectory."""
        actor = self.actor
        with self.turn("profile_train", rows=batch.num_rows):
            saved = actor.snapshot()
            start = time.perf_counter()
            actor.train(batch)
            seconds = time.perf_counter() - start
            actor.restore(saved)
        return seconds

    def log_probs(self, batch: RolloutBatch) -> torch.Tensor:
        """``[B, R]`` log-probs of `batch`'s responses under the trainer's current weights,
        at the training precision (bf16 agrees with a bf16 rollout to ~1e-2, not 1e-6)."""
        with self.turn("log_probs", rows=batch.num_rows):
            return self.actor.response_log_probs(batch)

    # -- weights, checkpoints, context switching -------------------------------------------

    def parameter_norm(self) -> float:
        """L2 norm of the policy's parameters (float64): a cheap fingerprint that moves
        whenever an optimizer step changed the weights (of this rank's shard on Megatron)."""
        with torch.no_grad():
            squares = [p.detach().double().pow(2).sum() for p in self.actor.model.parameters()]
            return float(torch.stack(squares).sum().sqrt())

    def buckets(self) -> Iterator[Bucket]:
        """The policy in buckets of at most ``bucket_bytes``."""
        return self.actor.state_dict_for_rollout(
            bucket_bytes=self.bucket_bytes, adapters_only=self.setup.lora_adapters is not None)

    def full_weights_on_every_rank(self) -> bool:
        """DDP and FSDP2 give every rank the whole policy; Megatron only the first rank of
        each model-parallel group."""
        return self.megatron is None

    def save(self, directory: str) -> None:
        """Write this rank's model, optimizer (+ critic), RNG state and step."""
        with self.turn("save"):
            self.actor.save_checkpoint(str(Path(directory)))

    def load(self, directory: str) -> int:
        """Restore what `save` wrote; returns the trainer's step."""
        with self.turn("load"):
            self.actor.load_checkpoint(str(Path(directory)))
        return self.actor.global_step

    def resident_memory_bytes(self) -> int | None:
        """Model, critic, gradients and optimizer state."""
        if self._actor is None:
            return None
        return state_bytes(self._actor.model, self._actor.critic, self._actor.optimizer)

    def onload(self) -> None:
        """Parameters and optimizer state back onto the device."""
        if self._actor is not None:
            self._actor.onload()

    def offload(self) -> None:
        """Parameters and optimizer state to host memory."""
        if self._actor is not None:
            self._actor.offload()


def _join_group_of_one(device: torch.device) -> None:
    """A process group of this one rank, unless the flow started one: the flow joins its
    ranks only when there are several, and megatron-core cuts its groups from the default
    one."""
    import torch.distributed as dist

    if dist.is_initialized():
        return
    join_process_group(rank=0, world_size=1, master_addr="127.0.0.1", master_port=0,
                       backend="nccl" if device.type == "cuda" else "gloo", timeout_s=60.0,
                       store=dist.HashStore())
