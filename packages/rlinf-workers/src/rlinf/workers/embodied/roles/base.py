"""What every embodied role shares: a `FlowWorker` (device turns, spans, channels) with
torch threads per device, and how weights travel."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator, Mapping
from typing import Any, Protocol

import numpy as np
import torch

from rlinf.workers.flow import FlowWorker
from rlinf.workers.runtime.context import WorkerContext
from rlinf.workers.runtime.threads import set_cpu_threads
from rlinf.workers.weight_sync import Bucket

__all__ = ["EmbodiedRole", "PolicyTarget", "Weights", "weights_from_wire", "weights_to_wire"]

Weights = Mapping[str, "np.ndarray | torch.Tensor"]
"""Parameters as they travel to the driver: numpy arrays (Ray's object store hands them
over without pickling the data; torch tensors it copies), torch tensors where numpy has no
dtype for them (bfloat16)."""


def weights_to_wire(weights: Mapping[str, torch.Tensor]) -> dict[str, np.ndarray | torch.Tensor]:
    """CPU numpy copies of `weights` (tensors numpy cannot hold stay tensors)."""
    return {k: v.detach().cpu().numpy() if v.dtype != torch.bfloat16 else v.detach().cpu()
            for k, v in weights.items()}


def weights_from_wire(weights: Weights) -> dict[str, torch.Tensor]:
    """Torch tensors owning their memory (received arrays may be read-only views)."""
    return {k: v if isinstance(v, torch.Tensor) else torch.tensor(v) for k, v in weights.items()}


class _LoadsWeights(Protocol):
    def set_weights(self, weights: Mapping[str, torch.Tensor]) -> None: ...


class PolicyTarget:
    """A rollout policy as a weight-sync target (`rlinf.workers.weight_sync.WeightTarget`):
    each bucket is a complete state dict (`EmbodiedActorRole.buckets` sends one bucket)."""

    def __init__(self, policy: _LoadsWeights) -> None:
        self._policy = policy

    def update_weights(self, named_tensors: Bucket) -> None:
        """Load the bucket (the policy copies it into its own parameters)."""
        self._policy.set_weights(dict(named_tensors))


class EmbodiedRole(FlowWorker):
    """A `rlinf.workers.flow.FlowWorker` that computes on its placement's devices.

    Torch runs with one intra-op thread per device of the rank (``num_threads`` overrides):
    a CPU "device" is a core slot, and more threads than slots oversubscribe the cores
    (measured ~20x slower PPO updates here). A trainer declared ``one_process`` gets every
    device of its placement in its context, so one process uses them all. With a device
    lock configured at launch, `turn` holds the rank's devices, so roles placed on the same
    devices take turns.
    """

    def __init__(self, context: WorkerContext, *, trace: bool = False,
                 num_threads: int | None = None, lock_timeout: float = 600.0,
                 io_timeout: float = 600.0, **kwargs: Any) -> None:
        super().__init__(context, trace=trace, lock_timeout=lock_timeout, io_timeout=io_timeout,
                         **kwargs)
        self.num_threads = num_threads or max(1, len(context.devices))
        set_cpu_threads(self.num_threads)

    @contextlib.contextmanager
    def turn(self, name: str, *, component: str | None = None,
             **args: Any) -> Iterator[None]:
        """`FlowWorker.turn` with this rank's torch threads: OpenMP's thread count is per
        calling thread, and Ray may run a call on another thread than the constructor's."""
        set_cpu_threads(self.num_threads, rescan=False)
        with super().turn(name, component=component, **args):
            yield

    def onload(self) -> None:
        """Nothing to move by default (CPU state); roles with device state override it."""

    def offload(self) -> None:
        """Nothing to free by default (CPU state); roles with device state override it."""
