"""Requests, replies and one-way messages over one authenticated wire connection.

The control plane of endpoints, channels and the TCP store is built on this: an `RpcPeer`
owns a `wire.Connection` and a reader thread that resolves replies (headers carrying `re`)
and hands every other message to a handler. An `RpcServer` accepts authenticated peers on a
`wire.Listener`. Headers are JSON dicts, payloads are raw buffers; nothing is pickled.
"""

from __future__ import annotations

import contextlib
import heapq
import itertools
import math
import os
import select
import threading
import time
from collections.abc import Callable, Sequence
from concurrent.futures import Future
from typing import Any, Protocol

from rlinf.comm import errors
from rlinf.comm._internal import wire
from rlinf.comm._internal.logs import get_logger

log = get_logger(__name__)

Header = dict[str, Any]
Buffers = list[memoryview]
Reply = tuple[Header, Buffers]
MessageHandler = Callable[["RpcPeer", Header, Buffers], None]


class Notifier(Protocol):
    """What one-way messages need of a connection: an `RpcPeer`, or a `LocalPeer` to a
    server in this process."""

    name: str

    @property
    def closed(self) -> bool: ...

    def notify(self, header: Header, buffers: Sequence[Any] = (), *,
               timeout: float | None = None) -> None: ...
CloseHandler = Callable[["RpcPeer", BaseException], None]

# How long `accept` blocks before the server re-checks whether it was closed.
_ACCEPT_POLL_S = 0.5
# How long the reader thread stays parked after a direct read (see `RpcPeer.read_direct`).
_DIRECT_LINGER_S = 0.01
# How long the reader waits for a frame before checking again (idle is not an error).
_IDLE_POLL_S = 3600.0
_MAX_WAIT_S = 3600.0
"""Longest single wait of the deadline thread (it loops until a far deadline)."""
_REPLY_SLACK = 1.07
_REPLY_MARGIN_S = 0.04
"""`reply_window`: 7% and 40 ms beyond a server-enforced limit (the bound is 10% and 50 ms;
the rest is left for raising)."""


def error_header(exc: BaseException) -> Header:
    """Describe an exception so that the peer can raise the same typed error."""
    return {"type": type(exc).__name__, "message": str(exc)}


def raise_error_header(info: Header) -> None:
    """Raise the typed error that `error_header` described (CommError if unknown)."""
    cls = getattr(errors, str(info.get("type", "")), None)
    message = str(info.get("message", "remote error"))
    if isinstance(cls, type) and issubclass(cls, errors.CommError):
        if cls is errors.MissingExtraError:
            raise errors.CommError(message)
        raise cls(message)
    raise errors.CommError(f"{info.get('type')}: {message}")


class RpcPeer:
    """One side of a control connection: calls with replies, notifications, pushes.

    Thread-safe: any thread may `call`/`notify`; replies are matched by request id.
    `on_message` runs on the reader thread, so it must not block for long.
    """

    def __init__(
        self,
        conn: wire.Connection,
        *,
        name: str,
        on_message: MessageHandler | None = None,
        on_close: CloseHandler | None = None,
    ) -> None:
        self.conn = conn
        self.name = name
        self.info: Header = {}  # what the peer said about itself in its hello
        self._on_message = on_message
        self._on_close = on_close
        self._ids = itertools.count(1)
        self._pending: dict[int, Future[Reply]] = {}
        self._lock = threading.Lock()
        self._closed: BaseException | None = None
        self._reader = threading.Thread(target=self._read_loop, name=f"rpc-{name}", daemon=True)
        # Direct reads (see `read_direct`) poll the socket; without its descriptor they are
        # skipped and the reader thread does all the reading.
        sock = getattr(conn, "_sock", None)
        self._fd: int | None = sock.fileno() if sock is not None else None
        self._read_lock = threading.Lock()
        self._direct = 0
        self._last_direct = 0.0
        # Direct readers take the plain lock (cheaper than entering the condition); the
        # reader thread sleeps on the condition built on it.
        self._direct_lock = threading.Lock()
        self._direct_cond = threading.Condition(self._direct_lock)

    def start(self) -> RpcPeer:
        self._reader.start()
        return self

    @property
    def closed(self) -> bool:
        return self._closed is not None

    def call_async(self, header: Header, buffers: Sequence[Any] = (), *,
                   timeout: float | None = None) -> Future[Reply]:
        """Send a request; the future resolves to the reply or fails with its typed error.

        `timeout` bounds the sending (None: the connection's default); the reply may take
        longer. A send that timed out before its first byte fails the future with
        CommTimeoutError and leaves the connection usable.
        """
        fut: Future[Reply] = Future()
        with self._lock:
            if self._closed is not None:
                fut.set_exception(self._closed)
                return fut
            rid = next(self._ids)
            self._pending[rid] = fut
        try:
            self.conn.send({**header, "id": rid}, buffers, timeout=timeout)
        except errors.CommError as exc:
            with self._lock:
                self._pending.pop(rid, None)
            if not fut.done():
                timed_out = isinstance(exc, errors.CommTimeoutError) and not self.conn.closed
                fut.set_exception(exc if timed_out else self._died(exc))
        return fut

    def call(self, header: Header, buffers: Sequence[Any] = (), *, timeout: float) -> Reply:
        """Send a request and wait for its reply; CommTimeoutError after `timeout` seconds
        in all (sending, reading and waiting share one deadline), whatever the peer does."""
        deadline = time.monotonic() + timeout
        fut = self.call_async(header, buffers, timeout=timeout)
        self.read_direct(fut.done, deadline=deadline)
        return wait_future(fut, timeout=max(deadline - time.monotonic(), 0.0),
                           what=f"reply to {header.get('op')!r} from {self.name}", limit=timeout)

    def notify(self, header: Header, buffers: Sequence[Any] = (), *,
               timeout: float | None = None) -> None:
        """Send a one-way message (no reply expected). `timeout` bounds the sending (None:
        the connection's default); one that struck before the first byte raises
        CommTimeoutError and leaves the connection usable (nothing was sent)."""
        if self._closed is not None:
            raise self._closed
        try:
            self.conn.send(header, buffers, timeout=timeout)
        except errors.CommTimeoutError:
            if self.conn.closed:  # mid-frame: the connection is gone
                raise self._died(errors.PeerDiedError("send timed out mid-frame")) from None
            raise
        except errors.CommError as exc:
            raise self._died(exc) from exc

    def reply(self, request: Header, header: Header, buffers: Sequence[Any] = ()) -> None:
        """Answer `request`; a peer that went away meanwhile is ignored (it cannot care)."""
        try:
            self.conn.send({**header, "re": request["id"]}, buffers)
        except errors.CommError:
            log.debug("rpc_reply_dropped", peer=self.name, op=request.get("op"))

    def reply_error(self, request: Header, exc: BaseException) -> None:
        self.reply(request, {"error": error_header(exc)})

    def close(self) -> None:
        self._fail_all(errors.PeerDiedError(f"connection to {self.name} was closed locally"))
        self.conn.close()

    def _died(self, cause: BaseException) -> errors.PeerDiedError:
        if isinstance(self._closed, errors.PeerDiedError):
            return self._closed
        return errors.PeerDiedError(f"peer {self.name} died or closed its connection ({cause})")

    def _fail_all(self, exc: BaseException) -> bool:
        with self._lock:
            if self._closed is not None:
                return False
            self._closed = exc
            pending, self._pending = self._pending, {}
        for fut in pending.values():
            if not fut.done():
                fut.set_exception(exc)
        return True

    def _on_close_once(self, died: BaseException) -> None:
        self._fail_all(died)
        if self._on_close is not None:
            self._on_close(self, self._closed or died)

    def read_direct(self, done: Callable[[], bool], *, deadline: float) -> None:
        """Read and dispatch frames in the calling thread until `done()` or `deadline`.

        A blocking receive calls this instead of waiting for the reader thread to hand the
        frame over: a thread handoff per message costs more than the message itself. The
        reader thread stands aside meanwhile (frames are still read one at a time).
        """
        fd = self._fd
        if fd is None:
            return
        monotonic = time.monotonic
        self._stand_aside()
        try:
            # A poll object per call: one object may not be polled from two threads at once.
            poller = select.poll()
            poller.register(fd, select.POLLIN)
            while not done() and self._closed is None:
                left = deadline - monotonic()
                if left <= 0:
                    return
                # Another thread reading this connection dispatches our frame as well.
                if not self._read_lock.acquire(timeout=min(left, 0.002)):
                    continue
                try:
                    while not done() and self._closed is None:
                        left = deadline - monotonic()
                        if left <= 0:
                            return
                        if poller.poll(int(min(left, 0.05) * 1000)) and not self._read_one():
                            return
                finally:
                    self._read_lock.release()
        finally:
            self._resume()

    def _stand_aside(self) -> None:
        """A direct reader starts: the reader thread leaves this connection to it."""
        with self._direct_lock:
            self._direct += 1

    def _resume(self) -> None:
        # No notify: the reader thread resumes on its own once direct reads stop for
        # `_DIRECT_LINGER_S` (waking it after every read would fight us for the GIL).
        with self._direct_lock:
            self._direct -= 1
            self._last_direct = time.monotonic()

    def _try_read_available(self, limit: int = 64) -> bool:
        """Read and dispatch the frames that have arrived (up to `limit`) unless another
        thread is reading this connection; False once the connection is gone.

        It drains rather than stopping at the frame its caller waits for: a streaming
        producer is usually a few frames ahead, and the gets after this one then find their
        items queued instead of each paying a poll and a wait of its own.
        """
        if not self._read_lock.acquire(blocking=False):
            return not self.closed  # the other reader dispatches what came
        try:
            for _ in range(limit):
                if self._closed is not None:
                    return False
                read = self._read_frame(wait=False)
                if read is None:
                    return True
                if not read:
                    return False
            return True
        finally:
            self._read_lock.release()

    def _readable(self, timeout: float) -> bool:
        if self._fd is None:
            return True
        # A poll object per call: one object may not be polled from two threads at once.
        poller = select.poll()
        poller.register(self._fd, select.POLLIN)
        return bool(poller.poll(max(0, int(timeout * 1000))))

    def _read_loop(self) -> None:
        if self._fd is None:
            while self._read_one():
                pass
            return
        while True:
            with self._direct_cond:
                while True:  # stand aside while receivers read for themselves
                    idle = time.monotonic() - self._last_direct
                    if self._direct:
                        self._direct_cond.wait(_DIRECT_LINGER_S)
                    elif idle < _DIRECT_LINGER_S:
                        self._direct_cond.wait(_DIRECT_LINGER_S - idle)
                    else:
                        break
            if self.closed:
                return
            if not self._readable(1.0):
                continue
            with self._read_lock:
                # Re-check under the lock: a direct reader may have taken the frame.
                if self._direct or not self._readable(0):
                    continue
                if not self._read_one():
                    return

    def _read_one(self) -> bool:
        """Read one frame and dispatch it; False once the connection is gone."""
        return self._read_frame(wait=True) is not False

    def _read_frame(self, *, wait: bool) -> bool | None:
        """Read one frame and dispatch it (True); False once the connection is gone. Without
        `wait`, None at once if no frame has started to arrive."""
        try:
            frame = (self.conn.recv(timeout=_IDLE_POLL_S) if wait
                     else self.conn.try_recv(timeout=_IDLE_POLL_S))
            if frame is None:
                return None
            header, buffers = frame
        except errors.CommTimeoutError:
            # Idle between frames: the connection is intact (wire's contract).
            if self.conn.closed:
                self._on_close_once(self._died(errors.PeerDiedError("closed")))
                return False
            return True
        except BaseException as exc:  # any failure ends the connection
            self._on_close_once(self._died(exc))
            return False
        self._dispatch(header, buffers)
        return True

    def _dispatch(self, header: Header, buffers: Buffers) -> None:
        rid = header.get("re")
        if rid is not None:
            with self._lock:
                fut = self._pending.pop(int(rid), None)
            if fut is None or fut.done():
                return
            if "error" in header:
                try:
                    raise_error_header(header["error"])
                except errors.CommError as exc:
                    fut.set_exception(exc)
            else:
                fut.set_result((header, buffers))
            return
        if self._on_message is None:
            return
        try:
            self._on_message(self, header, buffers)
        except Exception as exc:
            log.warning(
                "rpc_handler_failed", peer=self.name, op=header.get("op"), error=repr(exc)
            )
            if "id" in header:
                self.reply_error(header, exc)


def _drain(fd: int) -> None:
    with contextlib.suppress(BlockingIOError):
        os.read(fd, 4096)


def reply_window(limit: float) -> float:
    """How long a client waits for the answer to a request whose server enforces `limit`
    seconds itself: a little longer than `limit`, so that a live server's typed answer (not
    a race between two clocks) decides the outcome, and never more than ``1.1 * limit +
    0.05`` s, so that a call returns within that bound whatever the server does (a stopped
    or hung server included)."""
    return limit * _REPLY_SLACK + _REPLY_MARGIN_S


def wait_future(fut: Future[Any], *, timeout: float, what: str,
                limit: float | None = None) -> Any:
    """`fut.result(timeout)` with rlinf's typed timeout error (which names `limit`, the
    caller's whole budget, when it differs from what was left of it)."""
    try:
        return fut.result(timeout=timeout)
    except TimeoutError as exc:
        if isinstance(exc, errors.CommError):
            raise
        raise errors.CommTimeoutError(
            f"expected {what} within {timeout if limit is None else limit:.3g} s; got nothing"
        ) from None


class RpcServer:
    """Accepts authenticated peers on a listener and serves each with an `RpcPeer`.

    `on_message` and `on_close` receive the peer; `peer.info` holds the peer's hello.
    """

    def __init__(
        self,
        *,
        name: str,
        token: bytes,
        host: str = "127.0.0.1",
        port: int = 0,
        on_message: MessageHandler,
        on_close: CloseHandler | None = None,
    ) -> None:
        self.name = name
        self._listener = wire.Listener(host, port, token=token)
        self._on_message = on_message
        self._on_close = on_close
        self._peers: set[RpcPeer] = set()
        self._lock = threading.Lock()
        self._version = 0  # changes whenever a peer comes or goes (see `_direct_poller`)
        self._local = threading.local()
        self._stopped = threading.Event()
        self._acceptor = threading.Thread(
            target=self._accept_loop, name=f"accept-{name}", daemon=True
        )
        self._acceptor.start()

    @property
    def address(self) -> tuple[str, int]:
        host, port = self._listener.address
        return (str(host), int(port))

    def peers(self) -> list[RpcPeer]:
        with self._lock:
            return list(self._peers)

    def _direct_poller(self, wake_fd: int | None
                       ) -> tuple[dict[int, RpcPeer], select.poll]:
        """This thread's poll object over the live peers (and `wake_fd`), rebuilt only when
        peers came or went (a poll object must not be shared between threads)."""
        cached = getattr(self._local, "poller", None)
        key = (self._version, wake_fd)
        if cached is not None and cached[0] == key:
            return cached[1], cached[2]
        peers = {p._fd: p for p in self.peers() if p._fd is not None and not p.closed}
        poller = select.poll()
        for fd in peers:
            poller.register(fd, select.POLLIN)
        if wake_fd is not None:
            poller.register(wake_fd, select.POLLIN)
        self._local.poller = (key, peers, poller)
        return peers, poller

    def read_direct(self, done: Callable[[], bool], *, deadline: float,
                    wake_fd: int | None = None) -> None:
        """Read and dispatch the frames of every connected peer in the calling thread until
        `done()` or `deadline` (`RpcPeer.read_direct` over all of them).

        For a caller in the server's own process whose answer comes from one of the peers
        (a local consumer waiting for a producer's put): no thread hands the frame over.
        Peers that connect meanwhile are served by their reader threads; whoever settles
        `done` from another thread writes to `wake_fd` (drained here) so that the wait
        ends at once. Without a write it still re-checks `done` every 50 ms.
        """
        peers, poller = self._direct_poller(wake_fd)
        for peer in peers.values():
            peer._stand_aside()
        monotonic = time.monotonic
        try:
            while not done():
                left = deadline - monotonic()
                if left <= 0:
                    return
                for fd, _ in poller.poll(int(min(left, 0.05) * 1000) + 1):
                    if fd == wake_fd:
                        _drain(fd)
                    elif not peers[fd]._try_read_available():
                        poller.unregister(fd)  # gone: its reader handled the close
        finally:
            for peer in peers.values():
                peer._resume()

    def close(self) -> None:
        if self._stopped.is_set():
            return
        self._stopped.set()
        try:
            self._listener.close()
        except Exception as exc:  # closing twice or racing accept is harmless
            log.debug("listener_close_failed", server=self.name, error=repr(exc))
        for peer in self.peers():
            peer.close()

    def _accept_loop(self) -> None:
        # The listener runs every client's handshake concurrently in its own thread and
        # hands out only authenticated connections, so a silent or hostile client costs
        # this loop nothing.
        while not self._stopped.is_set():
            try:
                conn = self._listener.accept(timeout=_ACCEPT_POLL_S)
            except errors.CommTimeoutError:
                continue
            except Exception as exc:
                if self._stopped.is_set():
                    return
                log.warning("accept_failed", server=self.name, error=repr(exc))
                continue
            peer = RpcPeer(
                conn,
                name=f"{self.name}<-{conn.peer_address}",
                on_message=self._on_message,
                on_close=self._peer_closed,
            )
            with self._lock:
                if self._stopped.is_set():
                    conn.close()
                    return
                self._peers.add(peer)
                self._version += 1
            peer.start()

    def _peer_closed(self, peer: RpcPeer, exc: BaseException) -> None:
        with self._lock:
            self._peers.discard(peer)
            self._version += 1
        if self._on_close is not None and not self._stopped.is_set():
            self._on_close(peer, exc)


class Deadlines:
    """One thread that fires callbacks at deadlines (servers expire parked requests).

    Callbacks run on the timer thread and must be quick; `cancel` is O(1) (lazy deletion).
    """

    def __init__(self, *, name: str) -> None:
        self._heap: list[tuple[float, int]] = []
        # Callbacks by handle; cancel drops the callback at once (it may hold big objects).
        self._callbacks: dict[int, Callable[[], None]] = {}
        self._ids = itertools.count()
        self._cond = threading.Condition()
        self._stopped = False
        self.failed: BaseException | None = None
        """What killed the timer thread, if it died (it logs ``deadline_thread_failed``)."""
        self._thread = threading.Thread(target=self._run, name=f"deadlines-{name}", daemon=True)
        self._thread.start()

    def schedule(self, deadline: float, callback: Callable[[], None]) -> int:
        """Run `callback` at `time.monotonic() >= deadline`; returns a handle for `cancel`.

        Raises `CommError` when the timer thread died (reported when it happened): a
        request parked now would never expire.
        """
        if not math.isfinite(deadline):
            raise errors.InvalidArgumentError(f"deadline {deadline!r}: expected a finite time")
        if self.failed is not None:
            raise errors.CommError(f"the deadline thread {self._thread.name!r} died "
                                   f"({self.failed!r}); this server cannot park requests")
        with self._cond:
            handle = next(self._ids)
            self._callbacks[handle] = callback
            if len(self._heap) > 2 * len(self._callbacks) + 1024:
                # Drop cancelled entries (cancel is lazy on the heap).
                self._heap = [e for e in self._heap if e[1] in self._callbacks]
                heapq.heapify(self._heap)
            # Wake the timer thread only if it must fire sooner than it planned to.
            wake = not self._heap or deadline < self._heap[0][0]
            heapq.heappush(self._heap, (deadline, handle))
            if wake:
                self._cond.notify()
            return handle

    def cancel(self, handle: int) -> None:
        with self._cond:
            self._callbacks.pop(handle, None)

    def close(self) -> None:
        with self._cond:
            self._stopped = True
            self._cond.notify()

    def _run(self) -> None:
        try:
            self._loop()
        except BaseException as exc:  # never silent: parked requests would wait forever
            self.failed = exc
            log.error("deadline_thread_failed", name=self._thread.name, error=repr(exc))
            raise

    def _loop(self) -> None:
        while True:
            with self._cond:
                while not self._stopped:
                    if not self._heap:
                        self._cond.wait()
                        continue
                    deadline, handle = self._heap[0]
                    if handle not in self._callbacks:
                        heapq.heappop(self._heap)
                        continue
                    delay = deadline - time.monotonic()
                    if delay <= 0:
                        heapq.heappop(self._heap)
                        callback = self._callbacks.pop(handle)
                        break
                    # Bounded: a far deadline (clamped timeouts reach 30 days) must not
                    # overflow the timer; the loop re-checks.
                    self._cond.wait(min(delay, _MAX_WAIT_S))
                if self._stopped:
                    return
            try:
                callback()
            except Exception as exc:
                log.warning("deadline_callback_failed", error=repr(exc))
