"""What every embodied role shares: torch threads per device, spans, the device lock."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator, Mapping, Sequence

import numpy as np
import torch

from rlinf.workers.runtime.context import WorkerContext
from rlinf.workers.runtime.worker import Worker
from rlinf.workers.telemetry import Span, TraceRecorder

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


class RoleBase(Worker):
    """A `Worker` that computes on its placement's devices and records spans.

    Torch runs with one intra-op thread per device of the rank (``num_threads`` overrides):
    a CPU "device" is a core slot, and more threads than slots oversubscribe the cores
    (measured ~20x slower PPO updates here). With a device lock configured at launch,
    `computing` holds the rank's devices, so roles placed on the same devices take turns.
    """

    def __init__(self, context: WorkerContext, *, trace: bool = False,
                 num_threads: int | None = None, devices: Sequence[int] | None = None,
                 lock_timeout: float = 600.0) -> None:
        super().__init__(context)
        self.role_devices = tuple(devices) if devices is not None else context.devices
        """Devices this rank computes on (`devices` overrides the context's one device: a
        single process spanning several devices, e.g. the actor)."""
        self.num_threads = num_threads or max(1, len(self.role_devices))
        torch.set_num_threads(self.num_threads)
        self.trace = TraceRecorder(f"{context.role}/{context.rank}", enabled=trace)
        self.lock_timeout = lock_timeout

    @contextlib.contextmanager
    def computing(self) -> Iterator[None]:
        """Hold this rank's devices (when a device lock is configured) and its torch threads.

        OpenMP's thread count is per calling thread; Ray may run a call on another thread
        than the constructor's, so it is set again here.
        """
        torch.set_num_threads(self.num_threads)
        if self.context.device_lock_address is None or not self.role_devices:
            yield
            return
        with self.device_lock.hold(self.role_devices, component=self.role,
                                   timeout=self.lock_timeout):
            yield

    def drain_spans(self) -> list[Span]:
        """Spans recorded since the last drain."""
        return self.trace.drain()

    def onload(self) -> None:
        """Nothing to move by default (CPU state); roles with device state override it."""

    def offload(self) -> None:
        """Nothing to free by default (CPU state); roles with device state override it."""
