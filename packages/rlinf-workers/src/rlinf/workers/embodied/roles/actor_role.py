"""`EmbodiedActorRole`: PPO/GRPO training as a flow component: the trajectory comes in over a
channel, the updated weights go out through the runtime's weight sync (the driver passes
neither), and checkpoints keep every RNG."""

from __future__ import annotations

import copy
import random
import time
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from rlinf.comm import Channel
from rlinf.workers.embodied.actor import EmbodiedActorConfig, EmbodiedActorWorker
from rlinf.workers.embodied.roles.weights import Weights, weights_to_wire
from rlinf.workers.env.trajectory import Trajectory
from rlinf.workers.flow import FlowChannel, StepContext, WeightSender
from rlinf.workers.flow.channels import rank_key
from rlinf.workers.rollout.offload import state_bytes
from rlinf.workers.runtime.context import WorkerContext
from rlinf.workers.telemetry import Span
from rlinf.workers.weight_sync import Bucket

__all__ = ["EmbodiedActorRole", "TrainReport", "receive_trajectory"]


@dataclass(frozen=True)
class TrainReport:
    """What one update produced."""

    stats: dict[str, float]
    """Mean loss terms and diagnostics over the update's minibatches."""
    seconds: float
    """Wall time of the update."""
    spans: tuple[Span, ...]
    """One ``train`` span."""


def receive_trajectory(channel: Channel, *, step: int, env_ranks: int,
                       timeout: float) -> Trajectory:
    """Iteration `step`'s trajectory of every one of `env_ranks` env ranks from a trainer's
    input channel, joined in env order."""
    parts = [Trajectory.from_batch(channel.get(key=rank_key(0), timeout=timeout), step=step)
             for _ in range(env_ranks)]
    parts.sort(key=lambda part: int(part.env_indices[0]))
    return Trajectory.concat(parts)


class EmbodiedActorRole(WeightSender):
    """Owns the trainable policy (an `EmbodiedActorWorker`) in its own process."""

    def __init__(self, context: WorkerContext, *, config: EmbodiedActorConfig,
                 trace: bool = False, num_threads: int | None = None,
                 io_timeout: float = 600.0) -> None:
        super().__init__(context, trace=trace, io_timeout=io_timeout,
                         num_threads=num_threads or max(1, len(context.devices)))
        self.actor = EmbodiedActorWorker(context, config=config)

    def train_step(self, ctx: StepContext, *, input_channel: FlowChannel) -> dict[str, float]:
        """Iteration ``ctx.step``: wait (holding no device) for the trajectory of every env
        rank, joined in env order, then `train` on it; returns the update's statistics and
        ``train_seconds``. The runtime's weight sync then moves the new weights to the
        rollout policy."""
        trajectory = receive_trajectory(self.channel(input_channel), step=ctx.step,
                                        env_ranks=ctx.ranks[input_channel.src],
                                        timeout=self.io_timeout)
        stats, seconds = self._update(trajectory)
        return {**stats, "train_seconds": seconds}  # its span stays for the runtime's drain

    def train(self, trajectory: Trajectory) -> TrainReport:
        """`epochs` × `num_minibatches` updates on one rollout, in one device turn, with its
        ``train`` span (use without a flow; a flow drains spans through the runtime)."""
        stats, seconds = self._update(trajectory)
        return TrainReport(stats=stats, seconds=seconds, spans=tuple(self.drain_spans()))

    def _update(self, trajectory: Trajectory) -> tuple[dict[str, float], float]:
        started = time.perf_counter()
        with self.turn("train", samples=trajectory.rewards.size):
            stats = self.actor.train(trajectory)
        return stats, time.perf_counter() - started

    def buckets(self) -> Iterator[Bucket]:
        """The policy's parameters as one bucket: a complete state dict, which the rollout
        policy loads at once (`PolicyTarget`)."""
        yield list(self.actor.model.state_dict().items())

    def get_weights(self) -> Weights:
        """A CPU copy of the parameters, for the driver (evaluation; `weights_to_wire`)."""
        return weights_to_wire(self.actor.get_weights())

    def state(self) -> dict[str, Any]:
        """Model, optimizer, shuffling generator, step, and this process's global RNGs (a
        copy: later training does not change it)."""
        return {"actor": copy.deepcopy(self.actor.state()), "torch_rng": torch.get_rng_state(),
                "numpy_rng": np.random.get_state(), "python_rng": random.getstate()}

    def load_state(self, state: dict[str, Any]) -> None:
        """Inverse of `state`."""
        self.actor.load_state(state["actor"])
        torch.set_rng_state(state["torch_rng"])
        np.random.set_state(state["numpy_rng"])
        random.setstate(state["python_rng"])

    def resident_memory_bytes(self) -> int | None:
        """Model, gradients and Adam state."""
        return state_bytes(self.actor.model, self.actor.optimizer)

    def onload(self) -> None:
        """Move the model and optimizer state onto the actor's device."""
        self.actor.onload()

    def offload(self) -> None:
        """Move the model and optimizer state to host memory (frees a GPU)."""
        self.actor.offload()
