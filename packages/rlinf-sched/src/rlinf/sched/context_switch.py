"""Context switching: components that time-share a device move their state on and off it.

A worker implements `Onloadable` for each component it runs (weights, optimizer state, KV
cache): `onload()` brings the state onto the device, `offload()` frees the device (to host
memory or by dropping caches). The device lock (`rlinf.sched.device_lock`) drives it:

- acquiring a device onloads the component unless it is still resident from its last turn
  (the same component re-acquiring with no one in between skips the offload/onload pair);
- when another component is granted the device, the lock server first asks the resident
  component's process to offload, then grants.

`ContextSwitcher` is the per-process side: it keeps which components are onloaded here, runs
the hooks one at a time, times them, keeps a log of `SwitchEvent`s and forwards the times to a
`Profiler` (`record_switch`), from which the planner learns `CostModel.switch_time`.

Components start offloaded: a worker that builds its model on the device should call
`offload()` itself before registering it, or pass ``resident=True`` to `register` *and* be the
first to acquire the device.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Protocol, runtime_checkable

import structlog

from rlinf.sched.errors import DeviceLockError
from rlinf.sched.profiler import Profiler

__all__ = ["CallbackOnloadable", "ContextSwitcher", "Onloadable", "SwitchEvent"]

_log = structlog.get_logger(__name__)


@runtime_checkable
class Onloadable(Protocol):
    """State that can leave a device and come back (implemented by workers)."""

    def onload(self) -> None:
        """Bring the component's state onto its device(s)."""
        ...

    def offload(self) -> None:
        """Free the device: move the state to host memory, or drop what can be rebuilt."""
        ...


@dataclass(frozen=True)
class CallbackOnloadable:
    """An `Onloadable` from two callables (handy for workers with several models)."""

    on: Callable[[], None]
    off: Callable[[], None]

    def onload(self) -> None:
        self.on()

    def offload(self) -> None:
        self.off()


@dataclass(frozen=True)
class SwitchEvent:
    """One onload or offload that ran in this process."""

    component: str
    direction: str
    """``"onload"`` or ``"offload"``."""
    seconds: float
    started: float
    """Unix time the hook started."""
    device: int = -1
    """Device whose acquisition (onload) or eviction (offload) caused it."""


class ContextSwitcher:
    """Runs onload/offload hooks of this process's components, one at a time, and times them.

    Thread-safe: the device-lock client calls `offload` from its reader thread while the
    worker's thread may be in `onload` for another component.
    """

    def __init__(self, *, profiler: Profiler | None = None) -> None:
        self._targets: dict[str, Onloadable] = {}
        self._resident: dict[str, bool] = {}
        self._events: list[SwitchEvent] = []
        self._profiler = profiler
        self._lock = threading.RLock()

    def register(self, component: str, target: Onloadable, *, resident: bool = False) -> None:
        """Attach `target`'s hooks to `component` (offloaded unless `resident`)."""
        if not isinstance(target, Onloadable):
            raise DeviceLockError(
                f"component {component!r}: expected an object with onload() and offload(), "
                f"got {type(target).__name__}"
            )
        with self._lock:
            self._targets[component] = target
            self._resident[component] = resident

    def is_resident(self, component: str) -> bool:
        """Whether `component` is onloaded in this process (False if unregistered)."""
        with self._lock:
            return self._resident.get(component, False)

    @property
    def events(self) -> tuple[SwitchEvent, ...]:
        """Every onload/offload run so far, in order."""
        with self._lock:
            return tuple(self._events)

    def onload(self, component: str, *, device: int = -1) -> float:
        """Onload `component` unless it is resident; returns the seconds spent (0 if skipped)."""
        return self._switch(component, "onload", device)

    def offload(self, component: str, *, device: int = -1) -> float:
        """Offload `component` if it is resident; returns the seconds spent (0 if skipped)."""
        return self._switch(component, "offload", device)

    def _switch(self, component: str, direction: str, device: int) -> float:
        with self._lock:
            target = self._targets.get(component)
            want_resident = direction == "onload"
            if target is None or self._resident[component] == want_resident:
                return 0.0
            started = time.time()
            t0 = time.perf_counter()
            if want_resident:
                target.onload()
            else:
                target.offload()
            seconds = time.perf_counter() - t0
            self._resident[component] = want_resident
            self._events.append(SwitchEvent(component, direction, seconds, started, device))
        _log.debug("context_switch", component=component, direction=direction,
                   seconds=round(seconds, 6), device=device)
        if self._profiler is not None:
            self._profiler.record_switch(component, direction, seconds, device=device)
        return seconds
