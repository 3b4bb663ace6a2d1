"""`LocalPeer`: an RPC connection to a server that runs in this very process.

A channel handle in its owner's process would otherwise talk to the owner over a loopback
socket: a frame encoded and sent, read by the owner's reader thread, a reply sent back and
handed over to the caller's thread, each a wake-up on two busy cores. A `LocalPeer` offers
the calls a handle makes on an `RpcPeer` (`call_async`, `call`, `notify`, `read_direct`,
`close`) and runs the server's message handler in the calling thread; the server answers
through the peer's other face (`LocalPeer.remote`: `reply`, `reply_error`, `notify`), which
resolves the caller's futures or calls the handle's push handler directly. Headers and
buffers are handed over as objects: nothing is encoded, copied or sent.
"""

from __future__ import annotations

import contextlib
import itertools
import os
import threading
import time
from collections.abc import Callable, Sequence
from concurrent.futures import Future
from typing import Any

from rlinf.comm import errors
from rlinf.comm._internal.logs import get_logger
from rlinf.comm._internal.rpc import (
    Buffers,
    Header,
    Reply,
    error_header,
    raise_error_header,
    wait_future,
)

log = get_logger(__name__)

Handler = Callable[[Any, Header, Buffers], None]
"""A server's message handler, called with the server-side peer (as `RpcServer` does)."""
DirectRead = Callable[[Callable[[], bool], float, int], None]
"""Reads the server's other connections in the calling thread until done() or a deadline,
and returns early once the given file descriptor is written to."""


class LocalPeer:
    """The client side of an in-process connection to a server's `handler`.

    `on_message` receives what the server pushes (`remote.notify`), `on_close` runs once
    when either side closes. `direct_read`, if given, lets a caller waiting for a reply
    read the server's other connections itself (see `read_direct`).
    """

    def __init__(
        self,
        handler: Handler,
        *,
        name: str,
        on_message: Callable[[Any, Header, Buffers], None] | None = None,
        on_close: Callable[[Any, BaseException], None] | None = None,
        server_closed: Callable[[Any, BaseException], None] | None = None,
        direct_read: DirectRead | None = None,
    ) -> None:
        self.name = name
        self.info: Header = {}
        self._handler = handler
        self._on_message = on_message
        self._on_close = on_close
        self._server_closed = server_closed
        self._direct_read = direct_read
        self._ids = itertools.count(1)
        self._pending: dict[int, Future[Reply]] = {}
        self._lock = threading.Lock()
        self._closed: BaseException | None = None
        # Threads reading the server's connections for an answer, and the pipe that wakes
        # them when another thread settles it (see `read_direct`).
        self._readers: set[int] = set()
        self._wake: tuple[int, int] | None = None
        self.remote = _ServerSide(self)
        """The face the server holds: replies and pushes reach this peer's caller."""

    @property
    def closed(self) -> bool:
        return self._closed is not None

    # -- the client's calls (what a handle does with an `RpcPeer`) ----------------------------
    def call_async(self, header: Header, buffers: Sequence[Any] = (), *,
                   timeout: float | None = None) -> Future[Reply]:
        """Run the server's handler on the request now; the future resolves with its reply
        (at once, or later from whichever thread answers it)."""
        fut: Future[Reply] = Future()
        with self._lock:
            if self._closed is not None:
                fut.set_exception(self._closed)
                return fut
            rid = next(self._ids)
            self._pending[rid] = fut
        self._dispatch({**header, "id": rid}, list(buffers))
        return fut

    def call(self, header: Header, buffers: Sequence[Any] = (), *, timeout: float) -> Reply:
        deadline = time.monotonic() + timeout
        fut = self.call_async(header, buffers)
        self.read_direct(fut.done, deadline=deadline)
        return wait_future(fut, timeout=max(deadline - time.monotonic(), 0.0),
                           what=f"reply to {header.get('op')!r} from {self.name}", limit=timeout)

    def notify(self, header: Header, buffers: Sequence[Any] = (), *,
               timeout: float | None = None) -> None:
        if self._closed is not None:
            raise self._closed
        self._dispatch(header, list(buffers))

    def read_direct(self, done: Callable[[], bool], *, deadline: float) -> None:
        """Until `done()` or `deadline`: read the server's connections in this thread (the
        answer to our call comes from one of them), if the server offers that."""
        if self._direct_read is None or self._closed is not None:
            return
        me = threading.get_ident()
        with self._lock:
            if self._wake is None:
                self._wake = os.pipe()
                os.set_blocking(self._wake[0], False)
                os.set_blocking(self._wake[1], False)
            self._readers.add(me)
            wake = self._wake[0]
        try:
            self._direct_read(done, deadline, wake)
        finally:
            with self._lock:
                self._readers.discard(me)

    def close(self) -> None:
        """Leave: pending calls fail with PeerDiedError, the server forgets this client."""
        exc = errors.PeerDiedError(f"connection to {self.name} was closed locally")
        if self._fail_all(exc) and self._server_closed is not None:
            self._server_closed(self.remote, exc)

    def server_gone(self) -> None:
        """The server stopped: pending and later calls fail with PeerDiedError."""
        exc = errors.PeerDiedError(f"{self.name} stopped")
        if self._fail_all(exc) and self._on_close is not None:
            self._on_close(self, exc)

    def _dispatch(self, header: Header, buffers: Buffers) -> None:
        try:
            self._handler(self.remote, header, buffers)
        except Exception as exc:  # as `RpcPeer`: a failing handler answers with the error
            log.warning("rpc_handler_failed", peer=self.name, op=header.get("op"),
                        error=repr(exc))
            if "id" in header:
                self.remote.reply_error(header, exc)

    def _fail_all(self, exc: BaseException) -> bool:
        with self._lock:
            if self._closed is not None:
                return False
            self._closed = exc
            pending, self._pending = self._pending, {}
        for fut in pending.values():
            if not fut.done():
                fut.set_exception(exc)
        self._wake_readers()
        with self._lock:
            wake, self._wake = self._wake, None
            if wake is not None and not self._readers:
                os.close(wake[0])
                os.close(wake[1])
            elif wake is not None:  # a reader still polls it: closed with this object
                self._wake = wake
        return True

    def _wake_readers(self) -> None:
        """Wake the threads reading for an answer, unless this is the only one."""
        with self._lock:
            readers, wake = self._readers, self._wake
            if not readers or wake is None or readers == {threading.get_ident()}:
                return
        # full (a wake-up is pending anyway) or closed (the reader is leaving)
        with contextlib.suppress(OSError):
            os.write(wake[1], b"\0")

    def __del__(self) -> None:
        wake, self._wake = getattr(self, "_wake", None), None
        if wake is not None:
            for fd in wake:
                with contextlib.suppress(OSError):
                    os.close(fd)

    def _resolve(self, request: Header, header: Header, buffers: Sequence[Any]) -> None:
        with self._lock:
            fut = self._pending.pop(int(request["id"]), None)
        if fut is None or fut.done():
            return
        if "error" in header:
            try:
                raise_error_header(header["error"])
            except errors.CommError as exc:
                fut.set_exception(exc)
        else:
            fut.set_result((header, list(buffers)))
        self._wake_readers()

    def _push(self, header: Header, buffers: Sequence[Any]) -> None:
        if self._on_message is not None and self._closed is None:
            self._on_message(self, header, list(buffers))


class _ServerSide:
    """What the server sees of a `LocalPeer`: the calls it makes on an `RpcPeer`."""

    def __init__(self, peer: LocalPeer) -> None:
        self._peer = peer
        self.info: Header = {}
        self.name = peer.name

    @property
    def closed(self) -> bool:
        return self._peer.closed

    def reply(self, request: Header, header: Header, buffers: Sequence[Any] = ()) -> None:
        self._peer._resolve(request, header, buffers)

    def reply_error(self, request: Header, exc: BaseException) -> None:
        self.reply(request, {"error": error_header(exc)})

    def notify(self, header: Header, buffers: Sequence[Any] = ()) -> None:
        if self._peer.closed:
            raise errors.PeerDiedError(f"{self.name} left")
        self._peer._push(header, buffers)

    def wake(self) -> None:
        """Something the peer waits for was settled from another thread: end its direct
        read now, not at its next check."""
        self._peer._wake_readers()

    def close(self) -> None:
        self._peer.server_gone()
