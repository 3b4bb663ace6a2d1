"""Rendezvous: a small key-value `Store` interface and its TCP implementation.

Endpoints and channels publish their addresses here and look up their peers'. `TCPStore`
needs nothing but this package: one process runs a `TCPStoreServer` (a thread), every
process connects a `TCPStore` client to it. Connections are authenticated with the shared
token (HMAC challenge in `wire`); values are opaque bytes sent as raw buffers.
"""

from __future__ import annotations

import math
import threading
import time
from abc import ABC, abstractmethod
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

from rlinf.comm import errors
from rlinf.comm._internal import wire
from rlinf.comm._internal.logs import get_logger
from rlinf.comm._internal.rpc import (
    Buffers,
    Deadlines,
    Header,
    RpcPeer,
    RpcServer,
    reply_window,
)

log = get_logger(__name__)

#: Seconds a blocking store call waits when the caller passes no timeout.
DEFAULT_STORE_TIMEOUT_S = 300.0

Address = tuple[str, int]


def parse_address(address: str | Sequence[Any]) -> Address:
    """`"host:port"` or `(host, port)` -> `(host, port)`."""
    if isinstance(address, str):
        host, sep, port = address.rpartition(":")
        if not sep or not port.isdigit():
            raise ValueError(f"expected an address 'host:port'; got {address!r}")
        return (host.strip("[]"), int(port))
    if len(address) != 2:
        raise ValueError(f"expected an address (host, port); got {address!r}")
    return (str(address[0]), int(address[1]))


def format_address(address: Address) -> str:
    """`(host, port)` -> `"host:port"` (`"[host]:port"` for IPv6), as `parse_address` reads."""
    host = f"[{address[0]}]" if ":" in address[0] else address[0]
    return f"{host}:{address[1]}"


class Store(ABC):
    """Key-value rendezvous shared by the processes of one job.

    Keys are strings, values bytes. `get` and `wait` block until the keys exist;
    every call takes `timeout` (None: the store's default) and raises CommTimeoutError
    when it runs out, within 10% and 50 ms of it whatever the server does (a stopped
    server included). A write that timed out may still take effect if the server was
    only stalled.
    """

    @abstractmethod
    def set(self, key: str, value: bytes, *, timeout: float | None = None) -> None:
        """Store `value` under `key`, replacing any previous value."""

    @abstractmethod
    def get(self, key: str, *, timeout: float | None = None) -> bytes:
        """The value of `key`, waiting until some process sets it."""

    @abstractmethod
    def wait(self, keys: Sequence[str], *, timeout: float | None = None) -> None:
        """Return once every key in `keys` exists."""

    @abstractmethod
    def add(self, key: str, amount: int = 1, *, timeout: float | None = None) -> int:
        """Add `amount` to the integer at `key` (missing: 0) and return the new value."""

    @abstractmethod
    def compare_set(self, key: str, expected: bytes | None, desired: bytes, *,
                    timeout: float | None = None) -> bytes:
        """Set `key` to `desired` if its value is `expected` (None: the key is missing).

        Returns the value after the operation, so the caller learns whether it won.
        """

    @abstractmethod
    def delete(self, key: str, *, timeout: float | None = None) -> bool:
        """Remove `key`; True if it existed."""

    @abstractmethod
    def close(self) -> None:
        """Release this client's resources (and the server, if this client owns it)."""

    def __enter__(self) -> Store:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


MAX_TIMEOUT_S = 30 * 24 * 3600.0
"""Longest wait rlinf.comm honours; longer (finite) timeouts are clamped to it, since
timer APIs overflow on huge values (``threading`` refuses waits past ``TIMEOUT_MAX``)."""


def check_timeout(timeout: object) -> float:
    """A finite, non-negative number of seconds, clamped to `MAX_TIMEOUT_S` (every wait in
    rlinf.comm ends). Used by clients on every blocking call and by servers on every
    timeout a request carries."""
    try:
        value = float(timeout)  # type: ignore[arg-type]
    except (TypeError, ValueError) as exc:
        raise errors.InvalidArgumentError(
            f"expected a timeout in seconds; got {timeout!r}") from exc
    if isinstance(timeout, bool) or not math.isfinite(value) or value < 0:
        raise errors.InvalidArgumentError(
            f"expected a finite timeout >= 0 seconds; got {timeout!r}")
    return min(value, MAX_TIMEOUT_S)


def check_value(key: str, value: object) -> bytes:
    if not isinstance(key, str) or not key:
        raise TypeError(f"expected a non-empty str key; got {key!r}")
    if isinstance(value, bytes | bytearray | memoryview):
        return bytes(value)
    raise TypeError(f"expected a bytes value for key {key!r}; got {type(value).__name__}")


@dataclass
class _Waiter:
    peer: RpcPeer
    request: Header
    missing: set[str]
    reply_value_of: str | None  # get: reply with this key's value; wait: None
    handle: int | None = None
    finished: bool = field(default=False)


class TCPStoreServer:
    """The server side of `TCPStore`: a thread holding the key-value map.

    Serves until `close()` (or until the process exits: its threads are daemons).
    """

    def __init__(
        self, host: str = "127.0.0.1", port: int = 0, *, token: bytes | None = None
    ) -> None:
        self._data: dict[str, bytes] = {}
        self._waiters: list[_Waiter] = []
        self._lock = threading.Lock()
        self._deadlines = Deadlines(name="tcp-store")
        self._server = RpcServer(
            name="tcp-store",
            token=token if token is not None else wire.default_token(),
            host=host,
            port=port,
            on_message=self._handle,
        )
        log.debug("tcp_store_serving", address=self._server.address)

    @property
    def address(self) -> str:
        """``"host:port"``: what another process passes to `TCPStore`."""
        return format_address(self._server.address)

    @property
    def host_port(self) -> Address:
        """The same address as a ``(host, port)`` tuple."""
        return self._server.address

    def close(self) -> None:
        self._server.close()
        self._deadlines.close()

    def _handle(self, peer: RpcPeer, header: Header, buffers: Buffers) -> None:
        op = header.get("op")
        key = str(header.get("key", ""))
        with self._lock:
            if op == "set":
                self._data[key] = bytes(buffers[0])
                peer.reply(header, {})
                self._wake({key})
            elif op == "get":
                if key in self._data:
                    peer.reply(header, {}, [self._data[key]])
                else:
                    self._park(peer, header, {key}, key)
            elif op == "wait":
                missing = {str(k) for k in header["keys"]} - self._data.keys()
                if missing:
                    self._park(peer, header, missing, None)
                else:
                    peer.reply(header, {})
            elif op == "add":
                current = int(self._data.get(key, b"0"))
                value = current + int(header["amount"])
                self._data[key] = str(value).encode()
                peer.reply(header, {"value": value})
                self._wake({key})
            elif op == "compare_set":
                expected = bytes(buffers[0]) if header["has_expected"] else None
                if self._data.get(key) == expected:
                    self._data[key] = bytes(buffers[1])
                    self._wake({key})
                peer.reply(header, {}, [self._data.get(key, b"")])
            elif op == "delete":
                existed = self._data.pop(key, None) is not None
                peer.reply(header, {"existed": existed})
            else:
                peer.reply_error(header, errors.CommError(f"expected a store op; got {op!r}"))

    def _park(self, peer: RpcPeer, request: Header, missing: set[str], key: str | None) -> None:
        try:
            timeout = check_timeout(request.get("timeout", DEFAULT_STORE_TIMEOUT_S))
        except errors.InvalidArgumentError as exc:
            peer.reply_error(request, exc)
            return
        waiter = _Waiter(peer, request, missing, key)
        self._waiters.append(waiter)
        waiter.handle = self._deadlines.schedule(
            time.monotonic() + timeout, lambda: self._expire(waiter, timeout)
        )

    def _expire(self, waiter: _Waiter, timeout: float) -> None:
        with self._lock:
            if waiter.finished:
                return
            waiter.finished = True
            self._waiters.remove(waiter)
        waiter.peer.reply_error(
            waiter.request,
            errors.CommTimeoutError(
                f"expected store keys {sorted(waiter.missing)} to be set within {timeout:.3g} s; "
                "they are still missing"
            ),
        )

    def _wake(self, keys: Iterable[str]) -> None:
        changed = set(keys)
        for waiter in list(self._waiters):
            waiter.missing -= changed
            if waiter.missing:
                continue
            waiter.finished = True
            self._waiters.remove(waiter)
            if waiter.handle is not None:
                self._deadlines.cancel(waiter.handle)
            if waiter.reply_value_of is None:
                waiter.peer.reply(waiter.request, {})
            else:
                waiter.peer.reply(waiter.request, {}, [self._data[waiter.reply_value_of]])


class TCPStore(Store):
    """Client of a `TCPStoreServer`; thread-safe, one connection per client.

    `TCPStore.serve()` starts a server in this process and returns a client that owns it;
    other processes connect with `TCPStore(address, token=...)`, where `address` is this
    client's `address` (``"host:port"``; `host_port` is the same as a tuple).
    """

    def __init__(
        self,
        address: str | Sequence[Any],
        *,
        token: bytes | None = None,
        timeout: float = DEFAULT_STORE_TIMEOUT_S,
        connect_timeout: float = 30.0,
    ) -> None:
        self.host_port: Address = parse_address(address)
        """The server's ``(host, port)``."""
        self.token = token if token is not None else wire.default_token()
        self.timeout = timeout
        self._server: TCPStoreServer | None = None
        conn = wire.connect(self.host_port, token=self.token, timeout=connect_timeout)
        self._peer = RpcPeer(conn, name=f"tcp-store@{self.address}").start()

    @property
    def address(self) -> str:
        """``"host:port"`` of the server: what another process passes to `TCPStore`."""
        return format_address(self.host_port)

    @classmethod
    def serve(
        cls,
        host: str = "127.0.0.1",
        port: int = 0,
        *,
        token: bytes | None = None,
        timeout: float = DEFAULT_STORE_TIMEOUT_S,
    ) -> TCPStore:
        """Start a server in this process; the returned client closes it on `close()`."""
        server = TCPStoreServer(host, port, token=token)
        try:
            client = cls(server.address, token=token, timeout=timeout)
        except BaseException:
            server.close()
            raise
        client._server = server
        return client

    def _call(
        self, header: Header, buffers: Sequence[Any] = (), *, timeout: float | None = None
    ) -> tuple[Header, Buffers]:
        limit = check_timeout(self.timeout if timeout is None else timeout)
        # The server enforces `limit` and answers with a typed timeout; the client waits a
        # little longer so that a live server's answer, not a race, decides the outcome.
        return self._peer.call({**header, "timeout": limit}, buffers,
                               timeout=reply_window(limit))

    def set(self, key: str, value: bytes, *, timeout: float | None = None) -> None:
        self._call({"op": "set", "key": key}, [check_value(key, value)], timeout=timeout)

    def get(self, key: str, *, timeout: float | None = None) -> bytes:
        check_value(key, b"")
        _, buffers = self._call({"op": "get", "key": key}, timeout=timeout)
        return bytes(buffers[0])

    def wait(self, keys: Sequence[str], *, timeout: float | None = None) -> None:
        if isinstance(keys, str):
            raise TypeError(f"expected a sequence of keys; got the str {keys!r}")
        self._call({"op": "wait", "keys": list(keys)}, timeout=timeout)

    def add(self, key: str, amount: int = 1, *, timeout: float | None = None) -> int:
        reply, _ = self._call({"op": "add", "key": key, "amount": int(amount)},
                              timeout=timeout)
        return int(reply["value"])

    def compare_set(self, key: str, expected: bytes | None, desired: bytes, *,
                    timeout: float | None = None) -> bytes:
        old = b"" if expected is None else check_value(key, expected)
        buffers = [old, check_value(key, desired)]
        header = {"op": "compare_set", "key": key, "has_expected": expected is not None}
        _, out = self._call(header, buffers, timeout=timeout)
        return bytes(out[0])

    def delete(self, key: str, *, timeout: float | None = None) -> bool:
        reply, _ = self._call({"op": "delete", "key": key}, timeout=timeout)
        return bool(reply["existed"])

    def close(self) -> None:
        self._peer.close()
        if self._server is not None:
            self._server.close()
            self._server = None

    def __repr__(self) -> str:
        return f"TCPStore({self.address!r})"
