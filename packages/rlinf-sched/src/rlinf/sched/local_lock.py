"""Device locks between the components of one process: `LocalDeviceLock`.

Components that share a process (`rlinf.sched.process_sets`) and whose devices no other
process uses take turns through this lock instead of a `DeviceLockServer`: a hand-over is a
condition variable's wake-up, not two round trips to another process. The semantics are the
server's (`rlinf.sched.device_lock`): FIFO per device, several devices taken in ascending
order, re-entrant per component, timeouts that give back what was taken and name the
holder, and the one switch rule of `rlinf.sched.residency` — a component that is not
resident onloads, and residents that do not fit beside it offload first, least recently
used first, each through its own `ContextSwitcher` (its switches land in its profiler).

Each component opens its own `LocalLockClient` (``lock.client(owner, profiler=)``), which has
the methods a `DeviceLockClient` offers the worker runtime (`register`, `hold`, `acquire`,
`release`, `switch_events`, `close`). Processes find their lock by name (`named`): the
runtime gives every component of a process the same name.
"""

from __future__ import annotations

import contextlib
import math
import threading
import time
from collections import deque
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import ClassVar

import structlog

from rlinf.sched.context_switch import ContextSwitcher, Onloadable, SwitchEvent
from rlinf.sched.device_lock import Eviction, Grant
from rlinf.sched.errors import DeviceLockError, DeviceLockTimeoutError
from rlinf.sched.profiler import Profiler
from rlinf.sched.residency import Residency

__all__ = ["LocalDeviceLock", "LocalLockClient"]

_log = structlog.get_logger(__name__)


@dataclass(eq=False)
class _Request:
    component: str
    devices: list[int]


@dataclass(eq=False)
class _Device:
    residency: Residency[str]
    holder: str | None = None
    depth: int = 0
    queue: deque[_Request] = field(default_factory=deque)


class LocalDeviceLock:
    """The device locks of one process's components (module docstring).

    Args:
        device_memory: bytes of every device (an int) or per device index; None (unknown)
            keeps one component resident per device at a time, as the server does.
    """

    _named: ClassVar[dict[str, LocalDeviceLock]] = {}
    _named_guard: ClassVar[threading.Lock] = threading.Lock()

    def __init__(self, *, device_memory: int | Mapping[int, int] | None = None) -> None:
        self._memory_of_device = device_memory
        self._cond = threading.Condition()
        self._devices: dict[int, _Device] = {}
        self._clients: dict[str, LocalLockClient] = {}
        self._memory: dict[str, int | None] = {}
        self._holding: dict[str, int] = {}
        """Devices each component holds right now (it is not evicted meanwhile)."""

    @classmethod
    def named(cls, name: str, *, device_memory: int | Mapping[int, int] | None = None
              ) -> LocalDeviceLock:
        """This process's lock called `name`, made on first use."""
        with cls._named_guard:
            lock = cls._named.get(name)
            if lock is None:
                lock = cls._named[name] = cls(device_memory=device_memory)
            return lock

    def client(self, owner: str, *, profiler: Profiler | None = None) -> LocalLockClient:
        """A component's handle on the lock (`owner` names it in errors)."""
        return LocalLockClient(self, owner, profiler=profiler)

    # -- the state machine (callers hold self._cond) --------------------------------------

    def _device(self, index: int) -> _Device:
        device = self._devices.get(index)
        if device is None:
            memory = self._memory_of_device
            capacity = memory if isinstance(memory, int) or memory is None else memory.get(index)
            device = self._devices[index] = _Device(Residency(capacity))
        return device

    def _free_for(self, device: _Device, request: _Request) -> bool:
        if device.holder == request.component:
            return True  # re-entrant
        return device.holder is None and device.queue[0] is request

    def _acquire(self, client: LocalLockClient, component: str, devices: list[int],
                 timeout: float) -> Grant:
        deadline = time.monotonic() + timeout
        request = _Request(component, devices)
        taken: list[int] = []
        with self._cond:
            self._clients.setdefault(component, client)
            try:
                for index in devices:
                    device = self._device(index)
                    if device.holder != component:
                        device.queue.append(request)
                    while not self._free_for(device, request):
                        left = deadline - time.monotonic()
                        if left <= 0:
                            raise DeviceLockTimeoutError(
                                f"{client.owner} ({component}) waited for device {index}, held "
                                f"by {device.holder!r} (timeout {timeout:g} s)")
                        self._cond.wait(left)
                    if device.queue and device.queue[0] is request:
                        device.queue.popleft()
                    device.holder, device.depth = component, device.depth + 1
                    taken.append(index)
                self._holding[component] = self._holding.get(component, 0) + len(devices)
                evict, onload = self._admit(component, devices, deadline, timeout)
            except BaseException:
                for index in devices:
                    queue = self._device(index).queue
                    with contextlib.suppress(ValueError):
                        queue.remove(request)
                self._give_back(component, taken)
                raise
        evictions = tuple(self._evict(victim, device) for victim, device in evict)
        try:
            seconds = client.switcher.onload(component, device=devices[0]) if onload else 0.0
        except BaseException:
            with self._cond:  # not onloaded after all: neither resident nor holding
                for index in devices:
                    self._devices[index].residency.discard(component)
                self._give_back(component, devices)
            raise
        return Grant(tuple(devices), component, seconds, (), evictions)

    def _admit(self, component: str, devices: list[int], deadline: float, timeout: float
               ) -> tuple[list[tuple[str, int]], bool]:
        """Under the switch rule, the residents to evict (each with a device it leaves) and
        whether `component` onloads; residents still holding another device are waited for
        (offload is per component: it would pull state from under a running call)."""
        memory = self._memory.get(component)
        while True:
            plans = {i: self._devices[i].residency.plan(component, memory) for i in devices}
            busy = {v for p in plans.values() for v in p.evict if self._holding.get(v)}
            if not busy:
                break
            left = deadline - time.monotonic()
            if left <= 0:
                raise DeviceLockTimeoutError(
                    f"{component} waited for {sorted(busy)} to leave devices {devices} "
                    f"(timeout {timeout:g} s)")
            self._cond.wait(left)
        evict: dict[str, int] = {}
        for index, plan in plans.items():
            for victim in plan.evict:
                evict.setdefault(victim, index)
            self._devices[index].residency.commit(plan, memory)
        for victim in evict:  # it leaves every device it was resident on
            for other in self._devices.values():
                other.residency.discard(victim)
        return list(evict.items()), any(p.onload for p in plans.values())

    def _evict(self, victim: str, device: int) -> Eviction:
        client = self._clients.get(victim)
        ok, error, seconds = True, "", 0.0
        if client is not None:
            try:
                seconds = client.switcher.offload(victim, device=device)
            except Exception as exc:  # the grant goes ahead, as the server's does
                ok, error = False, f"{type(exc).__name__}: {exc}"
                _log.exception("offload_failed", component=victim, device=device)
        return Eviction(device, client.owner if client else victim, victim, seconds, ok, error)

    def _give_back(self, component: str, devices: Iterable[int]) -> None:
        released = 0
        for index in devices:
            device = self._devices[index]
            if device.holder != component or device.depth < 1:
                raise DeviceLockError(f"{component} releases device {index}, which it does "
                                      f"not hold (holder {device.holder!r})")
            device.depth -= 1
            if not device.depth:
                device.holder = None
            released += 1
        if released:
            left = self._holding.get(component, 0) - released
            if left > 0:
                self._holding[component] = left
            else:
                self._holding.pop(component, None)
        self._cond.notify_all()

    def _release(self, component: str, devices: list[int]) -> None:
        with self._cond:
            self._give_back(component, devices)

    def _register(self, client: LocalLockClient, component: str, memory: int | None) -> None:
        with self._cond:
            self._clients[component] = client
            self._memory[component] = memory

    def _leave(self, client: LocalLockClient) -> None:
        with self._cond:
            for component, owner in list(self._clients.items()):
                if owner is client:
                    del self._clients[component]
                    for device in self._devices.values():
                        device.residency.discard(component)
                        if device.holder == component:
                            device.holder, device.depth = None, 0
                    self._holding.pop(component, None)
            self._cond.notify_all()

    def state(self) -> list[dict[str, object]]:
        """Every device seen so far: holder, depth, residents, waiting components."""
        with self._cond:
            return [{"device": i, "holder": d.holder, "depth": d.depth,
                     "resident": list(d.residency.resident),
                     "waiting": [r.component for r in d.queue]}
                    for i, d in sorted(self._devices.items())]


class LocalLockClient:
    """One component's handle on a `LocalDeviceLock`; thread-safe."""

    def __init__(self, lock: LocalDeviceLock, owner: str, *,
                 profiler: Profiler | None = None) -> None:
        self.owner = owner
        self.switcher = ContextSwitcher(profiler=profiler)
        self._lock = lock
        self._closed = False

    def register(self, component: str, target: Onloadable, *, resident: bool = False,
                 memory_bytes: int | None = None) -> None:
        """Attach onload/offload hooks for `component` (as `DeviceLockClient.register`)."""
        if memory_bytes is not None and (isinstance(memory_bytes, bool) or memory_bytes < 0):
            raise DeviceLockError(f"memory_bytes={memory_bytes!r} for {component!r}: expected "
                                  "bytes >= 0 or None")
        self.switcher.register(component, target, resident=resident)
        self._lock._register(self, component, memory_bytes)

    @property
    def switch_events(self) -> tuple[SwitchEvent, ...]:
        """Every onload/offload of this client's components, in order."""
        return self.switcher.events

    def acquire(self, devices: int | Iterable[int], *, component: str, timeout: float) -> Grant:
        """Lock `devices` for `component`, onloading it (and offloading residents that do
        not fit beside it) as needed; `DeviceLockTimeoutError` after `timeout` seconds."""
        if self._closed:
            raise DeviceLockError(f"device-lock client {self.owner!r} is closed")
        devs = sorted({devices} if isinstance(devices, int) else set(devices))
        if not math.isfinite(timeout) or timeout < 0:
            raise DeviceLockError(f"timeout={timeout!r}: expected finite seconds >= 0")
        grant = self._lock._acquire(self, component, devs, timeout)
        return grant

    def release(self, devices: int | Iterable[int], *, timeout: float = 30.0) -> None:
        """Release one level of each of `devices` (the component stays resident, lazily)."""
        del timeout  # never waits
        devs = sorted({devices} if isinstance(devices, int) else set(devices))
        self._lock._release(self._component_of(devs), devs)

    def _component_of(self, devices: list[int]) -> str:
        with self._lock._cond:
            holders = {self._lock._devices[i].holder for i in devices if i in self._lock._devices}
        mine = [h for h in holders if h is not None and self._lock._clients.get(h) is self]
        if len(mine) != 1:
            raise DeviceLockError(f"{self.owner} releases devices {devices}, which none of its "
                                  f"components holds alone (holders {sorted(map(str, holders))})")
        return mine[0]

    @contextlib.contextmanager
    def hold(self, devices: int | Iterable[int], *, component: str,
             timeout: float) -> Iterator[Grant]:
        """``with client.hold(0, component="actor", timeout=60) as grant: ...``"""
        grant = self.acquire(devices, component=component, timeout=timeout)
        try:
            yield grant
        finally:
            self._lock._release(component, list(grant.devices))

    def close(self) -> None:
        """Leave the lock: what this client's components hold or keep resident is forgotten."""
        if not self._closed:
            self._closed = True
            self._lock._leave(self)
