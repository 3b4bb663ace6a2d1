"""The device-lock server: per-device FIFO locks over authenticated rlinf.comm connections.

One server serves every device of a run (or of a node). Each client connection is one
*owner* (a worker process, named by its owner id). Protocol — JSON headers, no payloads,
nothing pickled:

    client → server                                  server → client
    {"op": "hello", "owner": str}                    {"op": "welcome"} | {"op": "error", ...}
    {"op": "acquire", "id", "devices": [int],        {"op": "granted", "id", "devices", "onload",
     "component": str, "timeout": float,              "died": [...], "evictions": [...]}
     "memory": int | null}
                                                     | {"op": "timeout", "id", "message"}
    {"op": "release", "id", "devices": [int]}        {"op": "released", "id"} | {"op": "error"}
    {"op": "offloaded", "evict": int,                {"op": "offload", "evict": int,
     "seconds": float, "ok": bool}                    "component": str, "device": int}
    {"op": "state", "id"}                            {"op": "state", "id", "devices": [...]}
    {"op": "bye"}   (a clean close: held locks are released without a death notice)

Semantics:
- FIFO per device; a request for several devices takes them in ascending order (ordered
  acquisition: no deadlock between multi-device requests). Re-entrant: an owner that holds a
  device gets it again at once (depth + 1) and must release it as often.
- Lazy context switching under the one switch rule (`rlinf.sched.residency`, which the
  simulator prices): a released device keeps its (owner, component) *residents*. Granting
  it to a component that is not resident evicts residents, least recently used first, until
  the newcomer fits in the device's memory beside the rest — every resident when the
  device's capacity or a component's memory (``memory`` in the request, bytes per device)
  is unknown. Each eviction sends ``offload`` to that owner and the grant waits for every
  ``offloaded``; components that fit together stay co-resident and never switch. An
  eviction waits while the resident owner still holds another device with that component
  (offload is per process, so it would pull state from under a running step).
- Timeouts are enforced here: a request still waiting at its deadline gives back the
  devices it got and is answered ``timeout``.
- When a connection drops (the process died, even SIGKILL), its locks are released, its
  waits cancelled, its resident state forgotten, and the next grantee of each device it
  held is told in ``died``: ``{"device", "owner", "component"}``.
"""

from __future__ import annotations

import contextlib
import heapq
import itertools
import threading
import time
from collections import deque
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import structlog

from rlinf.comm.errors import CommError, CommTimeoutError, PeerDiedError
from rlinf.comm.wire import Connection, Listener
from rlinf.sched.residency import Residency

_log = structlog.get_logger(__name__)


@dataclass(eq=False)
class _Owner:
    name: str
    conn: Connection
    alive: bool = True
    leaving: bool = False
    """Said goodbye: what it still holds is released without a death notice."""
    requests: dict[int, _Request] = field(default_factory=dict)


@dataclass(eq=False)
class _Request:
    owner: _Owner
    rid: int
    component: str
    devices: list[int]
    deadline: float
    memory: int | None = None
    """Bytes per device the component needs (None: unknown)."""
    next: int = 0
    granted: list[int] = field(default_factory=list)
    """Devices this request took fresh (depth 0 → 1)."""
    reentered: list[int] = field(default_factory=list)
    """Devices the owner already held (depth + 1)."""
    onload: bool = False
    died: list[dict[str, Any]] = field(default_factory=list)
    evictions: list[dict[str, Any]] = field(default_factory=list)
    done: bool = False


_Key = tuple[_Owner, str]
"""A resident: (owner, component)."""


@dataclass(eq=False)
class _Device:
    index: int
    residency: Residency[_Key]
    holder: _Owner | None = None
    component: str = ""
    depth: int = 0
    queue: deque[_Request] = field(default_factory=deque)
    evicting: set[int] = field(default_factory=set)
    """Ids of the offloads this device waits for before granting its queue's head."""
    died: list[dict[str, Any]] = field(default_factory=list)


def _name(owner: _Owner | None) -> str | None:
    return owner.name if owner is not None else None


class LockServerCore:
    """The lock state machine; every method runs under `self.mutex` and queues replies."""

    def __init__(self, num_devices: int | None,
                 device_memory: int | Mapping[int, int] | None = None) -> None:
        self.num_devices = num_devices
        self.device_memory = device_memory
        self.mutex = threading.Lock()
        self.devices: dict[int, _Device] = {}
        self.owners: dict[str, _Owner] = {}
        self.outbox: list[tuple[Connection, dict[str, Any]]] = []
        self.evictions: dict[int, tuple[int, _Owner, str, float]] = {}
        self.deadlines: list[tuple[float, int, _Request]] = []
        self._evict_ids = itertools.count(1)
        self._seq = itertools.count()
        self.closed = False
        """Set when the server stops: nothing is granted any more."""

    # ------------------------------------------------------------------ helpers
    def _device(self, index: int) -> _Device:
        dev = self.devices.get(index)
        if dev is None:
            dev = self.devices[index] = _Device(index, Residency(self._capacity(index)))
        return dev

    def _capacity(self, index: int) -> int | None:
        if self.device_memory is None or isinstance(self.device_memory, int):
            return self.device_memory
        return self.device_memory.get(index)

    def _send(self, owner: _Owner, header: dict[str, Any]) -> None:
        if owner.alive:
            self.outbox.append((owner.conn, header))

    def take_outbox(self) -> list[tuple[Connection, dict[str, Any]]]:
        out, self.outbox = self.outbox, []
        return out

    def _holds_component(self, owner: _Owner, component: str) -> bool:
        return any(d.holder is owner and d.component == component for d in self.devices.values())

    # ------------------------------------------------------------------ requests
    def hello(self, name: str, conn: Connection) -> _Owner | str:
        if not name:
            return "expected a non-empty owner id"
        existing = self.owners.get(name)
        if existing is not None and existing.alive:
            return f"owner id {name!r} is already connected: expected one connection per owner"
        owner = _Owner(name, conn)
        self.owners[name] = owner
        return owner

    def acquire(self, owner: _Owner, rid: int, devices: list[int], component: str,
                timeout: float, *, memory: int | None = None) -> None:
        bad = [d for d in devices if d < 0 or (self.num_devices is not None
                                               and d >= self.num_devices)]
        if not devices or bad or len(set(devices)) != len(devices):
            limit = f"0-{self.num_devices - 1}" if self.num_devices else "indices >= 0"
            self._send(owner, {"op": "error", "id": rid, "message": (
                f"cannot acquire devices {devices}: expected a non-empty list of distinct "
                f"device indices in {limit}")})
            return
        if memory is not None and memory < 0:
            self._send(owner, {"op": "error", "id": rid, "message": (
                f"cannot acquire devices {devices} for {component!r} with memory={memory}: "
                "expected bytes >= 0 or null")})
            return
        req = _Request(owner, rid, component, sorted(devices), time.monotonic() + timeout,
                       memory)
        owner.requests[rid] = req
        heapq.heappush(self.deadlines, (req.deadline, next(self._seq), req))
        self._continue(req)

    def _continue(self, req: _Request) -> None:
        while req.next < len(req.devices):
            dev = self._device(req.devices[req.next])
            if dev.holder is req.owner:
                dev.depth += 1
                req.reentered.append(dev.index)
                req.next += 1
                continue
            dev.queue.append(req)
            self._advance(dev)
            return
        req.done = True
        req.owner.requests.pop(req.rid, None)
        self._send(req.owner, {
            "op": "granted", "id": req.rid, "devices": req.devices, "onload": req.onload,
            "died": req.died, "evictions": req.evictions,
        })

    def _advance(self, dev: _Device) -> None:
        if self.closed or dev.holder is not None or dev.evicting or not dev.queue:
            return
        req = dev.queue[0]
        admission = dev.residency.plan((req.owner, req.component), req.memory)
        leaving = []
        for key in admission.evict:
            res_owner, res_comp = key
            if not res_owner.alive:
                dev.residency.discard(key)
                continue
            if self._holds_component(res_owner, res_comp):
                return  # evict once the owner stops using that component
            leaving.append(key)
        if leaving:
            for res_owner, res_comp in leaving:
                evict = next(self._evict_ids)
                dev.evicting.add(evict)
                self.evictions[evict] = (dev.index, res_owner, res_comp, time.monotonic())
                self._send(res_owner, {"op": "offload", "evict": evict,
                                       "component": res_comp, "device": dev.index})
            return
        dev.queue.popleft()
        dev.holder, dev.component, dev.depth = req.owner, req.component, 1
        if dev.residency.admit((req.owner, req.component), req.memory).onload:
            req.onload = True
        if dev.died:
            req.died.extend(dev.died)
            dev.died = []
        req.granted.append(dev.index)
        req.next += 1
        self._continue(req)

    def offloaded(self, owner: _Owner, evict: int, seconds: float, ok: bool,
                  error: str = "") -> None:
        entry = self.evictions.pop(evict, None)
        if entry is None:
            return
        index, res_owner, comp, _ = entry
        self._finish_eviction(evict, index, res_owner, comp, seconds=seconds, ok=ok,
                              error=error)

    def _finish_eviction(self, evict: int, index: int, res_owner: _Owner, comp: str, *,
                         seconds: float, ok: bool, error: str) -> None:
        dev = self._device(index)
        dev.evicting.discard(evict)
        info = {"device": index, "owner": res_owner.name, "component": comp,
                "seconds": seconds, "ok": ok, "error": error}
        # Offload is per process: the component left every device it was resident on.
        for other in self.devices.values():
            other.residency.discard((res_owner, comp))
        if dev.queue:
            dev.queue[0].evictions.append(info)
        if not ok:
            _log.warning("offload_failed", device=index, owner=res_owner.name,
                         component=comp, error=error)
        self._advance_all()

    def release(self, owner: _Owner, rid: int, devices: list[int]) -> None:
        wrong = [d for d in devices if self._device(d).holder is not owner]
        if wrong:
            holders = {d: _name(self.devices[d].holder) for d in wrong}
            self._send(owner, {"op": "error", "id": rid, "message": (
                f"{owner.name!r} cannot release device(s) {wrong}: it does not hold them "
                f"(holders: {holders})")})
            return
        for d in devices:
            dev = self._device(d)
            dev.depth -= 1
            if dev.depth == 0:
                dev.holder = None
        self._send(owner, {"op": "released", "id": rid})
        self._advance_all()

    def _advance_all(self) -> None:
        for dev in list(self.devices.values()):
            self._advance(dev)

    def expire(self, now: float) -> None:
        while self.deadlines and self.deadlines[0][0] <= now:
            _, _, req = heapq.heappop(self.deadlines)
            if req.done or not req.owner.alive:
                continue
            waiting = self._device(req.devices[req.next])
            self._cancel(req)
            if waiting.holder is not None:
                what = f"held by {waiting.holder.name!r} ({waiting.component})"
            elif waiting.evicting:
                what = "being offloaded by its previous component"
            elif busy := [(o, c) for o, c in waiting.residency.resident
                          if self._holds_component(o, c)]:
                who = " and ".join(f"{o.name!r} to stop using {c!r}" for o, c in busy)
                what = f"waiting for {who} on its other devices before offloading it"
            else:
                what = "queued behind other waiters"
            self._send(req.owner, {"op": "timeout", "id": req.rid, "message": (
                f"device {waiting.index} was not granted to {req.owner.name!r} "
                f"({req.component}) in time: it is {what}; "
                f"{len(waiting.queue)} other request(s) wait for it")})
        self._advance_all()

    def _cancel(self, req: _Request) -> None:
        req.done = True
        req.owner.requests.pop(req.rid, None)
        if req.next < len(req.devices):
            dev = self._device(req.devices[req.next])
            with contextlib.suppress(ValueError):
                dev.queue.remove(req)
        for d in req.granted + req.reentered:
            dev = self._device(d)
            if dev.holder is req.owner:
                dev.depth -= 1
                if dev.depth == 0:
                    dev.holder = None

    def disconnect(self, owner: _Owner) -> None:
        if not owner.alive:
            return
        owner.alive = False
        for req in list(owner.requests.values()):
            self._cancel(req)
        for dev in self.devices.values():
            if dev.holder is owner:
                if not owner.leaving:
                    dev.died.append({"device": dev.index, "owner": owner.name,
                                     "component": dev.component})
                    _log.warning("device_holder_died", device=dev.index, owner=owner.name,
                                 component=dev.component)
                dev.holder, dev.depth = None, 0
            for key in dev.residency.resident:
                if key[0] is owner:
                    dev.residency.discard(key)
        for evict, (index, res_owner, comp, _) in list(self.evictions.items()):
            if res_owner is owner:
                del self.evictions[evict]
                self._finish_eviction(evict, index, owner, comp, seconds=0.0, ok=True,
                                      error="owner died")
        if self.owners.get(owner.name) is owner:
            del self.owners[owner.name]
        self._advance_all()

    def state(self) -> list[dict[str, Any]]:
        return [{
            "device": d.index,
            "holder": d.holder.name if d.holder else None,
            "component": d.component if d.holder else None,
            "depth": d.depth,
            "resident": [[o.name, c] for o, c in d.residency.resident],
            "waiting": [r.owner.name for r in d.queue],
        } for d in sorted(self.devices.values(), key=lambda d: d.index)]

    def next_deadline(self) -> float | None:
        return self.deadlines[0][0] if self.deadlines else None


class LockServerThreads:
    """Accept loop, one reader thread per connection, and a deadline timer."""

    def __init__(self, listener: Listener, core: LockServerCore) -> None:
        self.listener = listener
        self.core = core
        self.stopping = threading.Event()
        self.wakeup = threading.Condition(core.mutex)
        self.threads: list[threading.Thread] = []
        self.conns: list[Connection] = []

    def start(self) -> None:
        for target, name in ((self._accept_loop, "accept"), (self._timer_loop, "timer")):
            t = threading.Thread(target=target, name=f"rlinf-lock-{name}", daemon=True)
            t.start()
            self.threads.append(t)

    def stop(self) -> None:
        self.stopping.set()
        with self.wakeup:
            self.core.closed = True
            self.core.outbox.clear()
            self.wakeup.notify_all()
        self.listener.close()
        for conn in list(self.conns):
            conn.close("lock server stopped")
        for t in self.threads:
            t.join(timeout=5)

    def flush(self) -> None:
        with self.core.mutex:
            out = self.core.take_outbox()
            self.wakeup.notify_all()
        for conn, header in out:
            try:
                conn.send(header, timeout=10)
            except CommError as exc:
                _log.debug("lock_reply_dropped", peer=conn.peer_address, error=str(exc))

    def _accept_loop(self) -> None:
        while not self.stopping.is_set():
            try:
                conn = self.listener.accept(timeout=0.5)
            except CommTimeoutError:
                continue
            except (CommError, OSError) as exc:
                if self.stopping.is_set():
                    return
                _log.warning("lock_accept_failed", error=str(exc))
                continue
            self.conns.append(conn)
            t = threading.Thread(target=self._serve, args=(conn,), daemon=True,
                                 name="rlinf-lock-conn")
            t.start()
            self.threads.append(t)

    def _timer_loop(self) -> None:
        with self.wakeup:
            while not self.stopping.is_set():
                deadline = self.core.next_deadline()
                now = time.monotonic()
                if deadline is not None and deadline <= now:
                    self.core.expire(now)
                    out = self.core.take_outbox()
                    self.wakeup.release()
                    try:
                        for conn, header in out:
                            with contextlib.suppress(CommError):
                                conn.send(header, timeout=10)
                    finally:
                        self.wakeup.acquire()
                    continue
                self.wakeup.wait(timeout=1.0 if deadline is None else min(1.0, deadline - now))

    def _serve(self, conn: Connection) -> None:
        owner: _Owner | None = None
        try:
            header, _ = conn.recv(timeout=30)
            if header.get("op") != "hello":
                conn.send({"op": "error", "message": "expected a hello first"}, timeout=5)
                return
            with self.core.mutex:
                result = self.core.hello(str(header.get("owner", "")), conn)
            if isinstance(result, str):
                conn.send({"op": "error", "message": result}, timeout=5)
                return
            owner = result
            conn.send({"op": "welcome"}, timeout=5)
            _log.debug("lock_owner_connected", owner=owner.name)
            while not self.stopping.is_set():
                try:
                    header, _ = conn.recv(timeout=1.0)
                except CommTimeoutError:
                    continue
                with self.core.mutex:
                    self._dispatch(owner, header)
                self.flush()
        except PeerDiedError:
            pass
        except CommError as exc:
            _log.warning("lock_connection_failed", owner=owner.name if owner else None,
                         error=str(exc))
        finally:
            if owner is not None:
                with self.core.mutex:
                    self.core.disconnect(owner)
                self.flush()
                _log.debug("lock_owner_disconnected", owner=owner.name)
            conn.close()
            with contextlib.suppress(ValueError):
                self.conns.remove(conn)

    def _dispatch(self, owner: _Owner, header: dict[str, Any]) -> None:
        op = header.get("op")
        rid = int(header.get("id", 0))
        try:
            if op == "acquire":
                memory = header.get("memory")
                self.core.acquire(owner, rid, [int(d) for d in header["devices"]],
                                  str(header.get("component", "")), float(header["timeout"]),
                                  memory=None if memory is None else int(memory))
            elif op == "release":
                self.core.release(owner, rid, [int(d) for d in header["devices"]])
            elif op == "offloaded":
                self.core.offloaded(owner, int(header["evict"]), float(header["seconds"]),
                                    bool(header["ok"]), str(header.get("error", "")))
            elif op == "bye":
                owner.leaving = True
            elif op == "state":
                self.core.outbox.append((owner.conn, {"op": "state", "id": rid,
                                                      "devices": self.core.state()}))
            else:
                self.core.outbox.append((owner.conn, {"op": "error", "id": rid,
                                                      "message": f"unknown op {op!r}"}))
        except (KeyError, TypeError, ValueError) as exc:
            self.core.outbox.append((owner.conn, {"op": "error", "id": rid, "message": (
                f"malformed {op!r} request: {type(exc).__name__}: {exc}")}))
