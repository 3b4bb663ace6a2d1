"""`ReasoningRole`: what the rollout, reward, inference and actor roles share.

- torch threads = the rank's device count on CPU (a CPU slot is one core);
- a `TraceRecorder` on track ``"{role}/{rank}"`` (one span per stage and micro-batch);
- `turn`: hold this rank's devices (when the flow runs a device lock) for one unit of work,
  so roles collocated on a device take turns, with context switching through the role's
  ``onload``/``offload``; the time spent waiting and working is accounted separately;
- channel handles on the flow's `rlinf.comm.RayStore`, opened once per name.

Rule that keeps collocated placements deadlock-free: a role never waits on a channel while
holding its devices; it takes an input first, then the devices.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Iterator
from typing import Any

import torch

from rlinf.comm import Channel, Endpoint, RayStore
from rlinf.workers.errors import ConfigError
from rlinf.workers.reasoning.routing import rank_key, unpack_group
from rlinf.workers.reasoning.setup import RoleSetup
from rlinf.workers.rollout.batch import RolloutBatch
from rlinf.workers.runtime import Worker, WorkerContext
from rlinf.workers.telemetry import Span, TraceRecorder

__all__ = ["ReasoningRole"]


class ReasoningRole(Worker):
    """Base of the reasoning roles (see the module docstring)."""

    def __init__(self, context: WorkerContext, *, setup: RoleSetup) -> None:
        super().__init__(context)
        self.setup = setup
        if setup.device == "cpu":
            torch.set_num_threads(max(len(context.devices), 1))
        self.device = self._torch_device()
        self.trace = TraceRecorder(f"{context.role}/{context.rank}", enabled=setup.trace)
        self._channels: dict[str, Channel] = {}
        self._store: RayStore | None = None
        self._busy = 0.0
        self._switch_seen = 0.0

    def _torch_device(self) -> torch.device:
        if self.setup.device == "cpu":
            return torch.device("cpu")
        if not torch.cuda.is_available():
            raise ConfigError(f"{self!r} was placed with device='cuda' but sees no GPU; "
                              "launch it with num_gpus_per_rank > 0 or use device='cpu'")
        return torch.device("cuda", torch.cuda.current_device())

    # -- device turns ----------------------------------------------------------------------

    @contextlib.contextmanager
    def turn(self, name: str, **args: Any) -> Iterator[None]:
        """Hold this rank's devices (if the flow has a device lock) for one span of work."""
        locked = self.context.device_lock_address is not None
        hold = (self.hold_devices(timeout=self.setup.lock_timeout) if locked
                else contextlib.nullcontext())
        with hold, self.trace.span(name, **args):
            start = time.perf_counter()
            try:
                yield
            finally:
                self._busy += time.perf_counter() - start

    def busy_seconds(self) -> float:
        """Seconds spent inside `turn` since the last call (then reset)."""
        busy, self._busy = self._busy, 0.0
        return busy

    def drain_spans(self) -> list[Span]:
        """Spans recorded since the last call (the driver ships them into `StepResult`)."""
        spans = self.trace.drain()
        for event in (self._device_lock.switch_events if self._device_lock is not None else ()):
            if event.started >= self._switch_seen:
                spans.append(Span(self.trace.track, event.direction, event.started,
                                  event.started + event.seconds, {"device": event.device}))
        self._switch_seen = time.time()
        return spans if self.trace.enabled else []

    # -- channels --------------------------------------------------------------------------

    def channel(self, name: str) -> Channel:
        """This process's handle on the flow's channel `name` (connected on first use)."""
        handle = self._channels.get(name)
        if handle is None:
            if not self.setup.store_name:
                raise ConfigError(f"{self!r} has no channel store; the flow must set "
                                  "RoleSetup.store_name")
            if self._store is None:
                self._store = RayStore(self.setup.store_name)
                if self.setup.token is not None:
                    Endpoint(store=self._store, token=self.setup.token).make_current()
                else:
                    Endpoint.current(store=self._store)
            handle = Channel.connect(name, store=self._store, timeout=self.setup.io_timeout)
            self._channels[name] = handle
        return handle

    def receive(self, name: str, *, step: int, count: int, group_size: int,
                granularity: int) -> Iterator[list[tuple[int, RolloutBatch]]]:
        """This rank's `count` groups of iteration `step` from channel `name`, in messages of
        up to `granularity` groups (``(index, group)`` pairs, in arrival order)."""
        channel = self.channel(name)
        left = count
        while left > 0:
            take = min(max(granularity, 1), left)
            items = channel.get_batch(target_weight=take * group_size,
                                      key=rank_key(self.rank), timeout=self.setup.io_timeout)
            yield [unpack_group(item, step=step) for item in items]
            left -= len(items)

    def shutdown(self) -> None:
        """Flush and drop channel handles, then the base cleanup."""
        for handle in self._channels.values():
            with contextlib.suppress(Exception):
                handle.disconnect()
        self._channels.clear()
        super().shutdown()
