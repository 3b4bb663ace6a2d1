"""Distributed, re-entrant, fair per-device locks with context switching.

Components that share a device take turns on it. A `DeviceLockServer` (threads in any one
process, e.g. the driver) serves the locks of every device over rlinf.comm's authenticated
connections; each worker process opens one `DeviceLockClient` under a unique owner id::

    server = DeviceLockServer(token=token, num_devices=8)          # driver
    client = DeviceLockClient(server.address, token=token, owner="rollout-0")  # worker
    client.register("rollout", rollout_worker)                     # an Onloadable
    with client.hold(0, component="rollout", timeout=60) as grant:
        generate()                                                 # onloaded, exclusive

The server can also run as its own process (token from ``RLINF_COMM_TOKEN``, hex); it prints
``listening host:port`` on stdout (logs go to stderr) and serves until SIGTERM or SIGINT::

    python -m rlinf.sched.device_lock --host 0.0.0.0 --port 29600 --num-devices 8

Semantics (the protocol is in `rlinf.sched._lock_server`):

- **Mutual exclusion and fairness**: one owner holds a device at a time; waiters are served
  first come, first served (no starvation).
- **Re-entrant** for the same owner id: nested acquisitions succeed at once; release as often.
- **Several devices** in one call are taken in ascending order (ordered acquisition), so
  concurrent multi-device requests never deadlock. Holding locks and then acquiring a lower
  device in a separate call is the caller's lock-order violation.
- **Timeouts**: a request not granted in `timeout` seconds gives back what it took and raises
  `DeviceLockTimeoutError` naming the device and who holds it.
- **Holder death**: when a holder's process dies (its connection drops, SIGKILL included) its
  locks are released; the next owner granted each such device finds a `HolderDeath` in
  `Grant.holder_died` (a flag, not an exception: the grant itself is valid, and the caller
  decides whether the dead peer's partial work matters). `HolderDiedError` is raised by
  `Grant.raise_if_holder_died()` for callers that want to fail.
- **Context switching** under the one switch rule of `rlinf.sched.residency` (the rule the
  simulator prices): acquiring onloads the component through its registered `Onloadable`
  unless it is still resident; granting a device to a component that is not resident first
  makes residents' processes offload, least recently used first, until the newcomer fits in
  the device's memory (`DeviceLockServer(device_memory=)`, the bytes each component
  registers with `register(..., memory_bytes=)`). Components that fit together stay
  co-resident and never switch; with either size unknown, one component is resident at a
  time. Switch times go to the `Profiler` given to the client.
"""

from __future__ import annotations

import contextlib
import itertools
import math
import os
import socket
import threading
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass
from types import TracebackType
from typing import Any, Self

import structlog

from rlinf.comm.errors import CommError, CommTimeoutError, PeerDiedError
from rlinf.comm.wire import Address, Connection, Listener, connect
from rlinf.sched._lock_server import LockServerCore, LockServerThreads
from rlinf.sched.context_switch import ContextSwitcher, Onloadable, SwitchEvent
from rlinf.sched.errors import DeviceLockError, DeviceLockTimeoutError, HolderDiedError
from rlinf.sched.profiler import Profiler

__all__ = [
    "DeviceLockClient",
    "DeviceLockServer",
    "Eviction",
    "Grant",
    "HolderDeath",
    "default_owner_id",
    "main",
]

_log = structlog.get_logger(__name__)

_REPLY_GRACE = 30.0
"""Seconds beyond a request's own timeout to wait for the server before declaring it gone."""


def default_owner_id(prefix: str = "") -> str:
    """A unique owner id for this process: ``[prefix@]host:pid``."""
    ident = f"{socket.gethostname()}:{os.getpid()}"
    return f"{prefix}@{ident}" if prefix else ident


class DeviceLockServer:
    """Serves every device lock of a run from background threads of this process.

    Args:
        host, port: where to listen (port 0 picks a free one; see `address`).
        token: the run's shared secret (`rlinf.comm` handshake); clients must present it.
        num_devices: if given, requests for devices outside ``0..num_devices-1`` are refused.
        device_memory: bytes of memory of every device (an int) or per device index; None
            (unknown) keeps one component resident per device at a time.
    """

    def __init__(self, *, token: bytes, host: str = "127.0.0.1", port: int = 0,
                 num_devices: int | None = None,
                 device_memory: int | Mapping[int, int] | None = None) -> None:
        values = ([device_memory] if isinstance(device_memory, int)
                  else list((device_memory or {}).values()))
        if any(isinstance(v, bool) or not isinstance(v, int) or v < 0 for v in values):
            raise DeviceLockError(f"device_memory={device_memory!r}: expected bytes >= 0, per "
                                  "device index or one int for all")
        self._core = LockServerCore(num_devices, device_memory)
        self._threads = LockServerThreads(Listener(host, port, token=token), self._core)
        self._threads.start()
        self.address: Address = self._threads.listener.address
        _log.info("device_lock_server_started", address=self.address, num_devices=num_devices)

    def state(self) -> list[dict[str, Any]]:
        """Snapshot of every device seen so far: holder, depth, resident, waiting owners."""
        with self._core.mutex:
            return self._core.state()

    def close(self) -> None:
        """Stop serving; connected clients see the server as gone."""
        self._threads.stop()

    def __enter__(self) -> Self:
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.close()


@dataclass(frozen=True)
class HolderDeath:
    """A previous holder of `device` died while holding it."""

    device: int
    owner: str
    component: str


@dataclass(frozen=True)
class Eviction:
    """The resident component of `device` was offloaded (in its process) before this grant."""

    device: int
    owner: str
    component: str
    seconds: float
    ok: bool
    error: str = ""


@dataclass(frozen=True)
class Grant:
    """The result of a successful acquisition."""

    devices: tuple[int, ...]
    component: str
    onload_seconds: float
    """Seconds this process spent onloading (0 when the component was still resident)."""
    holder_died: tuple[HolderDeath, ...] = ()
    """Holders of these devices that died holding them since the last grant (see module doc)."""
    evictions: tuple[Eviction, ...] = ()
    """Offloads other processes ran to make room for this grant."""

    def raise_if_holder_died(self) -> None:
        """Raise `HolderDiedError` naming the dead holder(s), if any (the lock stays held)."""
        if self.holder_died:
            who = ", ".join(f"{d.owner} ({d.component}) on device {d.device}"
                            for d in self.holder_died)
            raise HolderDiedError(f"previous holder(s) died while holding the lock: {who}")


class _Pending:
    __slots__ = ("event", "reply")

    def __init__(self) -> None:
        self.event = threading.Event()
        self.reply: dict[str, Any] | None = None


class DeviceLockClient:
    """One process's connection to the lock server; thread-safe.

    Args:
        address: the server's ``(host, port)`` or ``"host:port"``.
        token: the run's shared secret.
        owner: this process's owner id (unique among live clients); default host:pid.
        profiler: receives onload/offload times (`Profiler.record_switch`).
        connect_timeout: seconds to connect and authenticate.
    """

    def __init__(self, address: Address | str, *, token: bytes, owner: str | None = None,
                 profiler: Profiler | None = None, connect_timeout: float = 30.0) -> None:
        self.owner = owner or default_owner_id()
        self.switcher = ContextSwitcher(profiler=profiler)
        self._ids = itertools.count(1)
        self._memory: dict[str, int | None] = {}
        self._pending: dict[int, _Pending] = {}
        self._lock = threading.Lock()
        # Held while an offload runs; `close` takes it before saying goodbye, so the server
        # never hands the device on while this process is still offloading.
        self._offload_lock = threading.Lock()
        self._closing = False
        self._gone: str | None = None
        try:
            self._conn: Connection = connect(address, token=token, timeout=connect_timeout)
            self._conn.send({"op": "hello", "owner": self.owner}, timeout=connect_timeout)
            reply, _ = self._conn.recv(timeout=connect_timeout)
        except CommError as exc:
            raise DeviceLockError(
                f"cannot reach the device-lock server at {address} as {self.owner!r}: {exc}"
            ) from exc
        if reply.get("op") != "welcome":
            self._conn.close()
            raise DeviceLockError(f"lock server refused {self.owner!r}: {reply.get('message')}")
        self._reader = threading.Thread(target=self._read_loop, daemon=True,
                                        name=f"rlinf-lock-client-{self.owner}")
        self._reader.start()

    # ------------------------------------------------------------------ public API
    def register(self, component: str, target: Onloadable, *, resident: bool = False,
                 memory_bytes: int | None = None) -> None:
        """Attach onload/offload hooks for `component` in this process.

        `memory_bytes` is what the component occupies on each device it holds (weights,
        optimizer state, caches at its planned batch); the server keeps components that fit
        together co-resident. None (unknown) makes it evict every other resident.
        """
        if memory_bytes is not None and (isinstance(memory_bytes, bool) or memory_bytes < 0):
            raise DeviceLockError(f"memory_bytes={memory_bytes!r} for {component!r}: expected "
                                  "bytes >= 0 or None")
        self.switcher.register(component, target, resident=resident)
        self._memory[component] = memory_bytes

    @property
    def switch_events(self) -> tuple[SwitchEvent, ...]:
        """Every onload/offload this process ran, in order."""
        return self.switcher.events

    def acquire(self, devices: int | Iterable[int], *, component: str,
                timeout: float) -> Grant:
        """Lock `devices` for `component`, onloading it if needed.

        Raises:
            DeviceLockTimeoutError: not granted within `timeout` seconds (nothing is held).
            DeviceLockError: the server is gone or refused the request.
        """
        devs = sorted({devices} if isinstance(devices, int) else set(devices))
        if not math.isfinite(timeout) or timeout < 0:
            raise DeviceLockError(f"timeout={timeout!r}: expected finite seconds >= 0")
        reply = self._request({"op": "acquire", "devices": devs, "component": component,
                               "timeout": float(timeout),
                               "memory": self._memory.get(component)},
                              wait=timeout + _REPLY_GRACE)
        op = reply.get("op")
        if op == "timeout":
            raise DeviceLockTimeoutError(f"{reply['message']} (timeout {timeout:g} s)")
        if op != "granted":
            raise DeviceLockError(f"acquire {devs} refused: {reply.get('message', reply)}")
        died = tuple(HolderDeath(int(d["device"]), str(d["owner"]), str(d["component"]))
                     for d in reply.get("died", []))
        evictions = tuple(Eviction(int(e["device"]), str(e["owner"]), str(e["component"]),
                                   float(e["seconds"]), bool(e["ok"]), str(e.get("error", "")))
                          for e in reply.get("evictions", []))
        for death in died:
            _log.warning("device_lock_previous_holder_died", device=death.device,
                         dead_owner=death.owner, dead_component=death.component,
                         owner=self.owner)
        try:
            seconds = self.switcher.onload(component, device=devs[0])
        except BaseException:
            with contextlib.suppress(DeviceLockError):
                self.release(devs)
            raise
        return Grant(tuple(devs), component, seconds, died, evictions)

    def release(self, devices: int | Iterable[int], *, timeout: float = 30.0) -> None:
        """Release one level of each of `devices` (the component stays resident, lazily)."""
        devs = sorted({devices} if isinstance(devices, int) else set(devices))
        reply = self._request({"op": "release", "devices": devs}, wait=timeout)
        if reply.get("op") != "released":
            raise DeviceLockError(f"release {devs} refused: {reply.get('message', reply)}")

    @contextlib.contextmanager
    def hold(self, devices: int | Iterable[int], *, component: str,
             timeout: float) -> Iterator[Grant]:
        """``with client.hold(0, component="actor", timeout=60) as grant: ...``"""
        grant = self.acquire(devices, component=component, timeout=timeout)
        try:
            yield grant
        finally:
            self.release(grant.devices)

    def state(self, *, timeout: float = 30.0) -> list[dict[str, Any]]:
        """The server's view of every device (for diagnostics)."""
        reply = self._request({"op": "state"}, wait=timeout)
        return list(reply.get("devices", []))

    def close(self) -> None:
        """Disconnect; the server releases whatever this owner still holds (no death notice).

        An offload already running finishes first; one that arrives later is skipped (the
        process is leaving, and the server frees its residency at goodbye).
        """
        with self._offload_lock:
            self._closing = True
            with contextlib.suppress(CommError):
                self._conn.send({"op": "bye"}, timeout=5)
        self._fail_all("client closed")
        self._conn.close("client closed")
        if self._reader is not threading.current_thread():
            self._reader.join(timeout=5)

    def __enter__(self) -> Self:
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.close()

    # ------------------------------------------------------------------ internals
    def _request(self, header: dict[str, Any], *, wait: float) -> dict[str, Any]:
        rid = next(self._ids)
        pending = _Pending()
        with self._lock:
            if self._gone is not None:
                raise DeviceLockError(f"device-lock client {self.owner!r} is unusable: "
                                      f"{self._gone}")
            self._pending[rid] = pending
        try:
            self._conn.send({**header, "id": rid}, timeout=30)
        except CommError as exc:
            with self._lock:
                self._pending.pop(rid, None)
            raise DeviceLockError(f"lost the device-lock server: {exc}") from exc
        if not pending.event.wait(wait):
            with self._lock:
                self._pending.pop(rid, None)
            raise DeviceLockError(
                f"the device-lock server did not answer {header['op']!r} within {wait:g} s"
            )
        return pending.reply or {"op": "error", "message": "empty reply"}

    def _fail_all(self, reason: str) -> None:
        with self._lock:
            if self._gone is None:
                self._gone = reason
            pending, self._pending = self._pending, {}
        for p in pending.values():
            p.reply = {"op": "error", "message": reason}
            p.event.set()

    def _read_loop(self) -> None:
        try:
            while True:
                try:
                    header, _ = self._conn.recv(timeout=1.0)
                except CommTimeoutError:
                    continue
                if header.get("op") == "offload":
                    self._on_offload(header)
                    continue
                with self._lock:
                    pending = self._pending.pop(int(header.get("id", -1)), None)
                if pending is not None:
                    pending.reply = header
                    pending.event.set()
        except PeerDiedError as exc:
            self._fail_all(f"lock server connection lost ({exc})")
        except CommError as exc:
            self._fail_all(f"lock server connection failed ({exc})")

    def _on_offload(self, header: dict[str, Any]) -> None:
        component = str(header["component"])
        device = int(header.get("device", -1))
        ok, error, seconds = True, "", 0.0
        with self._offload_lock:
            if self._closing:
                return  # goodbye already sent: the server no longer waits for this offload
            try:
                seconds = self.switcher.offload(component, device=device)
            except Exception as exc:  # report to the server, which grants anyway
                ok, error = False, f"{type(exc).__name__}: {exc}"
                _log.exception("offload_failed", component=component, device=device)
            with contextlib.suppress(CommError):
                self._conn.send({"op": "offloaded", "evict": int(header["evict"]),
                                 "seconds": seconds, "ok": ok, "error": error}, timeout=30)


def main(argv: list[str] | None = None) -> int:
    """Run a lock server process until SIGTERM/SIGINT (see the module docstring)."""
    import argparse
    import signal

    from rlinf.comm.wire import default_token

    parser = argparse.ArgumentParser(prog="python -m rlinf.sched.device_lock",
                                     description="Serve RLinf device locks.")
    parser.add_argument("--host", default="127.0.0.1", help="interface to listen on")
    parser.add_argument("--port", type=int, default=0, help="port (0: pick a free one)")
    parser.add_argument("--num-devices", type=int, default=None,
                        help="refuse device indices outside 0..N-1")
    args = parser.parse_args(argv)
    import sys

    structlog.configure(logger_factory=structlog.PrintLoggerFactory(sys.stderr))
    stop = threading.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: stop.set())
    with DeviceLockServer(token=default_token(), host=args.host, port=args.port,
                          num_devices=args.num_devices) as server:
        print(f"listening {server.address[0]}:{server.address[1]}", flush=True)
        stop.wait()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
