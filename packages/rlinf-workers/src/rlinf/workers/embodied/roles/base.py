"""What every embodied role shares: a `FlowWorker` (device turns, spans, channels) with
torch threads per device, and how weights travel."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator, Mapping, Sequence
from typing import Any

import numpy as np
import torch

from rlinf.workers.errors import ConfigError
from rlinf.workers.flow import FlowChannel, FlowWorker, rank_key
from rlinf.workers.runtime.context import WorkerContext

__all__ = ["RoleBase", "Weights", "weights_from_wire", "weights_to_wire"]

Weights = Mapping[str, "np.ndarray | torch.Tensor"]
"""Parameters as they travel between roles: numpy arrays (Ray's object store hands them
over without pickling the data; torch tensors it copies), torch tensors where numpy has no
dtype for them (bfloat16)."""


def weights_to_wire(weights: Mapping[str, torch.Tensor]) -> dict[str, np.ndarray | torch.Tensor]:
    """CPU numpy copies of `weights` (tensors numpy cannot hold stay tensors)."""
    return {k: v.detach().cpu().numpy() if v.dtype != torch.bfloat16 else v.detach().cpu()
            for k, v in weights.items()}


def weights_from_wire(weights: Weights) -> dict[str, torch.Tensor]:
    """Torch tensors owning their memory (received arrays may be read-only views)."""
    return {k: v if isinstance(v, torch.Tensor) else torch.tensor(v) for k, v in weights.items()}


class RoleBase(FlowWorker):
    """A `rlinf.workers.flow.FlowWorker` that computes on its placement's devices.

    Torch runs with one intra-op thread per device of the rank (``num_threads`` overrides):
    a CPU "device" is a core slot, and more threads than slots oversubscribe the cores
    (measured ~20x slower PPO updates here). With a device lock configured at launch,
    `turn` holds the rank's devices, so roles placed on the same devices take turns; the
    channels of `FlowWorker` carry trajectories and weights between roles, never through
    the driver.
    """

    def __init__(self, context: WorkerContext, *, trace: bool = False,
                 num_threads: int | None = None, devices: Sequence[int] | None = None,
                 lock_timeout: float = 600.0, io_timeout: float = 600.0) -> None:
        self.role_devices = tuple(devices) if devices is not None else context.devices
        """Devices this rank computes on (`devices` overrides the context's one device: a
        single process spanning several devices, e.g. the actor)."""
        super().__init__(context, trace=trace, lock_timeout=lock_timeout, io_timeout=io_timeout)
        self.num_threads = num_threads or max(1, len(self.role_devices))
        torch.set_num_threads(self.num_threads)

    @property
    def devices(self) -> tuple[int, ...]:
        """The devices this rank computes on and holds in its turns."""
        return self.role_devices

    @contextlib.contextmanager
    def turn(self, name: str, **args: Any) -> Iterator[None]:
        """`FlowWorker.turn` with this rank's torch threads: OpenMP's thread count is per
        calling thread, and Ray may run a call on another thread than the constructor's."""
        torch.set_num_threads(self.num_threads)
        with super().turn(name, **args):
            yield

    def create_weights_channel(self, channel: FlowChannel) -> str:
        """Own the channel the trainer puts updated weights into (at launch)."""
        return self.create_channel(channel)

    def pull_weights(self, channel: FlowChannel) -> None:
        """Load the weights the trainer put into `channel` (`ActorRole.push_weights`)."""
        batch = self.channel(channel).get(key=rank_key(0), timeout=self.io_timeout)
        self.set_weights(dict(batch.tensors))

    def set_weights(self, weights: Weights) -> None:
        """Load policy weights (roles that serve a policy override it)."""
        raise ConfigError(f"{type(self).__name__} serves no policy to load weights into")

    def onload(self) -> None:
        """Nothing to move by default (CPU state); roles with device state override it."""

    def offload(self) -> None:
        """Nothing to free by default (CPU state); roles with device state override it."""
