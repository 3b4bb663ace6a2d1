"""Authenticated, framed, zero-copy message connections over TCP.

A *frame* is one message: a small JSON header plus any number of raw buffers::

    prefix   struct "!4sII": magic b"RLF1", header length, buffer count
    lengths  struct "!{n}Q": the byte length of each buffer
    header   UTF-8 JSON object
    buffers  the raw bytes of each buffer, back to back

Sending gathers the prefix, the header and the caller's buffers with one
``socket.sendmsg`` (no concatenation copy). Receiving reads the prefix and header, then
``recv_into`` straight into one freshly allocated, 64-byte aligned block: the bytes land
once, where the caller will read them. The header is JSON and nothing received is ever
unpickled.

Before either side reads a single payload byte, both prove they hold the shared token
with a mutual HMAC-SHA256 challenge–response (`Listener.accept` / `connect`); a peer
that fails it is closed and `AuthenticationError` is raised.

Timeouts: every blocking call takes ``timeout`` (seconds); ``None`` means the
connection's ``default_timeout``. Nothing blocks forever. A timeout that strikes before
the first byte of a frame leaves the connection usable; one that strikes mid-frame
closes it (the byte stream would be out of step), and later calls raise `PeerDiedError`.
"""

from __future__ import annotations

import collections
import contextlib
import json
import math
import os
import select
import socket
import struct
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass
from types import TracebackType
from typing import Any, Self

import pyarrow as pa

from rlinf.comm._internal.auth import (
    TOKEN_ENV,
    ServerHandshake,
    check_token,
    client_handshake,
    default_token,
    new_token,
    token_env_value,
)
from rlinf.comm._internal.logs import get_logger
from rlinf.comm._internal.sockio import Deadline, recv_exact_into, send_all, wait_fd
from rlinf.comm.errors import CodecError, CommTimeoutError, PeerDiedError

__all__ = [
    "DEFAULT_TIMEOUT",
    "TOKEN_ENV",
    "Address",
    "Connection",
    "Listener",
    "connect",
    "default_token",
    "new_token",
    "token_env_value",
]

log = get_logger(__name__)

Address = tuple[str, int]

DEFAULT_TIMEOUT = 300.0
"""Seconds a call waits when given ``timeout=None`` (overridable per connection)."""

_MAGIC = b"RLF1"
_PREFIX = struct.Struct("!4sII")
_MAX_HEADER_BYTES = 64 << 20
_HEADER_CHUNK = 64 << 10  # the first read of a frame's header; later reads double
_MAX_BUFFERS = 1 << 16
_ALIGN = 64  # Arrow's preferred buffer alignment; receivers decode zero-copy from it.
# One encoder for every frame: `json.dumps` with options builds a new one per call.
_encode_header = json.JSONEncoder(separators=(",", ":"), allow_nan=False).encode
# Headers are ASCII JSON (the encoder escapes the rest, and writes no whitespace): decoded
# as text, without `json.loads`'s sniffing for UTF-16 and UTF-32 or its whitespace scans on
# every frame (`_decode_header` still refuses anything after the object).
_raw_decode = json.JSONDecoder().raw_decode


def _decode_header(text: str) -> Any:
    """`json.loads(text)`, faster on what our encoder writes."""
    try:
        value, end = _raw_decode(text)
    except ValueError:  # leading whitespace, or malformed: `json.loads` says which
        return json.loads(text)
    if end != len(text) and text[end:].strip(" \t\n\r"):
        raise ValueError(f"expected one JSON value, got {len(text) - end} characters after it")
    return value


def _as_bytes_view(buf: Any) -> memoryview:
    try:
        view = memoryview(buf)
    except TypeError as exc:
        raise CodecError(f"expected a buffer-protocol object, got {type(buf).__name__}") from exc
    if not view.c_contiguous:
        raise CodecError("expected a C-contiguous buffer, got a strided one")
    return view.cast("B") if view.format != "B" or view.ndim != 1 else view


class Connection:
    """One authenticated, bidirectional message stream. Thread-safe.

    `send` and `recv` may run concurrently from different threads; concurrent sends
    (and concurrent receives) are serialised so frames never interleave.
    """

    def __init__(self, sock: socket.socket, *, default_timeout: float = DEFAULT_TIMEOUT,
                 max_frame_bytes: int = 1 << 40) -> None:
        sock.setblocking(False)
        with contextlib.suppress(OSError):
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self._sock = sock
        self._send_lock = threading.Lock()
        self._recv_lock = threading.Lock()
        self._prefix = memoryview(bytearray(_PREFIX.size))  # parsed under `_recv_lock`
        self._closed: str | None = None
        # Whole frames sent and received (after the handshake, so both ends count the same
        # frames): a channel orders what a producer sends by other ways against them.
        self.frames_sent = 0
        self.frames_received = 0
        self.default_timeout = default_timeout
        self.max_frame_bytes = max_frame_bytes
        try:
            peer = sock.getpeername()
        except OSError:
            peer = ("", 0)
        # A Unix socket's peer is a path (often empty): shown as that path and port 0.
        self.peer_address: Address = ((str(peer[0]), int(peer[1])) if isinstance(peer, tuple)
                                      else (f"unix:{peer!r}", 0))

    # -- lifecycle --------------------------------------------------------------------
    @property
    def closed(self) -> bool:
        return self._closed is not None

    def close(self, reason: str = "closed locally") -> None:
        """Close the connection; blocked `recv`/`send` calls in other threads wake up."""
        if self._closed is not None:
            return
        self._closed = reason
        with contextlib.suppress(OSError):
            self._sock.shutdown(socket.SHUT_RDWR)
        self._sock.close()

    def __enter__(self) -> Self:
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.close()

    def __repr__(self) -> str:
        state = f"closed: {self._closed}" if self._closed else "open"
        return f"Connection(peer={self.peer_address}, {state})"

    def _check_open(self) -> None:
        if self._closed is not None:
            raise PeerDiedError(f"connection to {self.peer_address} is closed ({self._closed})")

    def _deadline(self, timeout: float | None) -> Deadline:
        return Deadline(self.default_timeout if timeout is None else timeout)

    # -- sending ----------------------------------------------------------------------
    def send(self, header: dict[str, Any], buffers: Sequence[Any] = (), *,
             timeout: float | None = None) -> None:
        """Send one frame. The buffers are read in place (not copied) during the call."""
        try:
            header_bytes = _encode_header(header).encode()
        except (TypeError, ValueError) as exc:
            raise CodecError(f"expected a JSON-serialisable header dict, got {exc}") from exc
        if not isinstance(header, dict):
            raise CodecError(f"expected a header dict, got {type(header).__name__}")
        views = [_as_bytes_view(b) for b in buffers]
        if len(views) > _MAX_BUFFERS:
            raise CodecError(f"expected at most {_MAX_BUFFERS} buffers, got {len(views)}")
        prefix = _PREFIX.pack(_MAGIC, len(header_bytes), len(views))
        lengths = struct.pack(f"!{len(views)}Q", *(v.nbytes for v in views))
        out = [memoryview(prefix + lengths + header_bytes)] + [v for v in views if v.nbytes]
        deadline = self._deadline(timeout)
        with self._send_lock:
            self._check_open()
            progress = [0]
            try:
                send_all(self._sock, out, deadline, "send", progress)
            except CommTimeoutError:
                # A partly sent frame would desynchronise the stream: give it up.
                if progress[0]:
                    self.close("a send timed out mid-frame")
                raise
            except PeerDiedError:
                self.close("peer died during send")
                raise
            self.frames_sent += 1

    # -- receiving --------------------------------------------------------------------
    def recv(self, *, timeout: float | None = None) -> tuple[dict[str, Any], list[memoryview]]:
        """Receive one frame: its header and its buffers.

        The caller owns the returned buffers: writable memoryviews on one fresh,
        64-byte aligned allocation that lives as long as any view of it does.
        """
        frame = self._recv(self._deadline(timeout), wait=True)
        assert frame is not None
        return frame

    def try_recv(self, *, timeout: float | None = None
                 ) -> tuple[dict[str, Any], list[memoryview]] | None:
        """`recv` if a frame has started to arrive, else None at once (no waiting for its
        first byte); `timeout` bounds reading the rest of it."""
        return self._recv(self._deadline(timeout), wait=False)

    def _recv(self, deadline: Deadline, *, wait: bool
              ) -> tuple[dict[str, Any], list[memoryview]] | None:
        with self._recv_lock:
            self._check_open()
            pview = self._prefix
            # Wait for the first byte without committing: a timeout here is harmless.
            first = 0
            while first == 0:
                try:
                    first = self._sock.recv_into(pview, _PREFIX.size)
                except BlockingIOError:
                    if not wait:
                        return None
                    wait_fd(self._sock, select.POLLIN, deadline, "recv")
                    continue
                except (ConnectionError, OSError) as exc:
                    self.close("peer died")
                    raise PeerDiedError(f"recv from {self.peer_address}: {exc}") from exc
                if first == 0:
                    self.close("peer closed the connection")
                    raise PeerDiedError(f"peer {self.peer_address} closed the connection")
            try:
                frame = self._recv_rest(pview, first, deadline)
            except (CommTimeoutError, PeerDiedError, CodecError) as exc:
                self.close(f"recv failed mid-frame: {type(exc).__name__}")
                raise
            self.frames_received += 1
            return frame

    def _recv_growing(self, size: int, deadline: Deadline, what: str) -> bytearray:
        """`size` bytes, allocated as they arrive rather than up front.

        `size` is what the peer declared: allocating it at once let a peer that sends a
        prefix and nothing more make us hold (zero-filled) memory it never sent — 64 MiB
        per connection. Chunks grow geometrically, so memory stays within twice what
        arrived and a large header costs one extra copy; a small one is a single read.
        """
        first = bytearray(min(size, _HEADER_CHUNK))
        recv_exact_into(self._sock, memoryview(first), deadline, what)
        if len(first) == size:
            return first
        chunks = [first]
        got = len(first)
        while got < size:
            chunk = bytearray(min(size - got, got))
            try:
                recv_exact_into(self._sock, memoryview(chunk), deadline, what)
            except PeerDiedError as exc:
                raise PeerDiedError(f"{what}: peer closed the connection after at least "
                                    f"{got} of {size} bytes ({exc})") from exc
            chunks.append(chunk)
            got += len(chunk)
        return bytearray().join(chunks)

    def _recv_rest(self, pview: memoryview, first: int,
                   deadline: Deadline) -> tuple[dict[str, Any], list[memoryview]]:
        if first < _PREFIX.size:
            recv_exact_into(self._sock, pview[first:], deadline, "recv frame prefix")
        magic, header_len, nbuf = _PREFIX.unpack(pview)
        if magic != _MAGIC:
            raise CodecError(f"expected frame magic {_MAGIC!r}, got {bytes(magic)!r}")
        if header_len > _MAX_HEADER_BYTES or nbuf > _MAX_BUFFERS:
            raise CodecError(
                f"expected a header of at most {_MAX_HEADER_BYTES} bytes and at most "
                f"{_MAX_BUFFERS} buffers, got {header_len} bytes and {nbuf} buffers")
        meta = self._recv_growing(8 * nbuf + header_len, deadline, "recv frame header")
        lengths = struct.unpack_from(f"!{nbuf}Q", meta)
        try:
            header = _decode_header(meta[8 * nbuf:].decode())
        except (UnicodeDecodeError, ValueError) as exc:
            raise CodecError(f"expected a JSON header, got undecodable bytes ({exc})") from exc
        if not isinstance(header, dict):
            raise CodecError(f"expected a JSON object header, got {type(header).__name__}")
        offsets = []
        total = 0
        for n in lengths:
            offsets.append(total)
            total += (n + _ALIGN - 1) // _ALIGN * _ALIGN
        if total > self.max_frame_bytes:
            raise CodecError(f"expected a frame of at most {self.max_frame_bytes} bytes, "
                             f"got {total}")
        if not lengths:
            return header, []
        # One aligned allocation for all buffers; pyarrow's allocator aligns to 64 bytes
        # and does not zero-fill (the kernel's fresh pages are zero anyway).
        block = memoryview(pa.allocate_buffer(max(total, 1)))
        views = [block[off:off + n] for off, n in zip(offsets, lengths, strict=True)]
        for view in views:
            recv_exact_into(self._sock, view, deadline, "recv frame buffers")
        return header, views


@dataclass(eq=False)
class _Pending:
    """A client whose handshake is under way (see `Listener`)."""

    sock: socket.socket
    peer: Any
    handshake: ServerHandshake
    deadline: float
    proven: bool = False


class Listener:
    """Accepts authenticated connections on a TCP port.

    A background thread accepts clients and runs their handshakes concurrently, without
    blocking on any one of them (non-blocking sockets multiplexed with ``poll``): a client
    that connects and says nothing, or too little, costs one socket until
    `handshake_timeout` and delays no other client. `accept` hands out only connections
    whose client proved the token; refused clients are closed, logged and counted in
    `refused`. At most `max_pending` handshakes run at once; a client arriving when all
    are taken evicts the oldest one whose client has not proven the token yet (closed and
    counted), so a flood of idle connections cycles through the table instead of locking
    out the legitimate clients that arrive after it. Only when every pending client has
    proven the token is the newcomer closed at once (and counted).
    """

    def __init__(self, host: str = "127.0.0.1", port: int = 0, *, token: bytes,
                 backlog: int = 128, default_timeout: float = DEFAULT_TIMEOUT,
                 handshake_timeout: float = 10.0, max_pending: int = 1024) -> None:
        check_token(token)
        self._token = bytes(token)
        self._default_timeout = default_timeout
        self._handshake_timeout = handshake_timeout
        self._max_pending = max_pending
        family = socket.AF_INET6 if ":" in host else socket.AF_INET
        self._sock = socket.create_server((host, port), family=family, backlog=backlog)
        self._sock.setblocking(False)
        bound = self._sock.getsockname()
        self.address: Address = (str(bound[0]), int(bound[1]))
        self._closed = False
        self._ready: collections.deque[Connection] = collections.deque()
        self._cond = threading.Condition()
        self.refused = 0
        """Clients closed without a connection: wrong token, silent, or over `max_pending`."""
        self._wake_r, self._wake_w = os.pipe()
        os.set_blocking(self._wake_r, False)
        self._thread = threading.Thread(target=self._serve, daemon=True,
                                        name=f"rlinf-listener-{self.address[1]}")
        self._thread.start()

    def accept(self, *, timeout: float | None = None) -> Connection:
        """The next client that proved the shared token, waiting at most `timeout`.

        Raises `CommTimeoutError` when none did in time, `PeerDiedError` once closed.
        """
        wait = self._default_timeout if timeout is None else timeout
        if not math.isfinite(wait) or wait < 0:
            raise ValueError(f"timeout={timeout!r}: expected finite seconds >= 0")
        with self._cond:
            if not self._cond.wait_for(lambda: self._ready or self._closed, timeout=wait):
                raise CommTimeoutError(f"no authenticated client at {self.address} within "
                                       f"{wait:g} s")
            if self._ready:
                return self._ready.popleft()
            raise PeerDiedError(f"listener {self.address} is closed")

    def close(self) -> None:
        with self._cond:
            if self._closed:
                return
            self._closed = True
            self._cond.notify_all()
        with contextlib.suppress(OSError):
            os.write(self._wake_w, b"x")
        if self._thread is not threading.current_thread():
            self._thread.join(timeout=10)
        self._sock.close()
        with self._cond:
            unclaimed, self._ready = list(self._ready), collections.deque()
        for conn in unclaimed:
            conn.close("listener closed")
        os.close(self._wake_r)
        os.close(self._wake_w)

    def __enter__(self) -> Self:
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.close()

    # -- the handshake thread --------------------------------------------------------------

    def _serve(self) -> None:
        pending: dict[int, _Pending] = {}
        poller = select.poll()
        poller.register(self._sock.fileno(), select.POLLIN)
        poller.register(self._wake_r, select.POLLIN)
        try:
            while not self._closed:
                now = time.monotonic()
                next_deadline = min((p.deadline for p in pending.values()), default=now + 1.0)
                events = poller.poll(max(0, int((next_deadline - now) * 1000)) + 1)
                for fd, mask in events:
                    if fd == self._wake_r:
                        continue
                    if fd == self._sock.fileno():
                        self._accept_ready(pending, poller)
                    elif fd in pending:
                        self._step(pending, poller, fd, mask)
                now = time.monotonic()
                for fd in [fd for fd, p in pending.items() if p.deadline <= now]:
                    log.debug("handshake_timed_out", peer=pending[fd].peer,
                              address=self.address)
                    self._drop(pending, poller, fd)
        except Exception as exc:  # a dead handshake thread would lock every client out
            log.error("listener_failed", address=self.address, error=repr(exc))
            with self._cond:
                self._closed = True
                self._cond.notify_all()
        finally:
            for fd in list(pending):
                self._drop(pending, poller, fd, count=False)

    def _accept_ready(self, pending: dict[int, _Pending], poller: select.poll) -> None:
        while True:
            try:
                sock, peer = self._sock.accept()
            except (BlockingIOError, InterruptedError):
                return
            except OSError as exc:
                if not self._closed:
                    log.warning("accept_failed", address=self.address, error=str(exc))
                return
            if len(pending) >= self._max_pending and not self._evict_oldest(pending, poller):
                log.warning("handshake_backlog_full", peer=peer, address=self.address,
                            pending=len(pending))
                self.refused += 1
                sock.close()
                continue
            sock.setblocking(False)
            entry = _Pending(sock, peer, ServerHandshake(self._token),
                             time.monotonic() + self._handshake_timeout)
            pending[sock.fileno()] = entry
            poller.register(sock.fileno(), select.POLLIN | select.POLLOUT)

    def _evict_oldest(self, pending: dict[int, _Pending], poller: select.poll) -> bool:
        """Drop the oldest handshake whose client has not proven the token; False if all
        have."""
        unproven = [fd for fd, entry in pending.items() if not entry.proven]
        if not unproven:
            return False
        oldest = min(unproven, key=lambda fd: pending[fd].deadline)
        log.warning("handshake_evicted", peer=pending[oldest].peer, address=self.address,
                    pending=len(pending))
        self._drop(pending, poller, oldest)
        return True

    def _step(self, pending: dict[int, _Pending], poller: select.poll, fd: int,
              mask: int) -> None:
        entry = pending[fd]
        hs = entry.handshake
        try:
            if hs.outgoing:
                sent = entry.sock.send(hs.outgoing)
                hs.outgoing = hs.outgoing[sent:]
            if not hs.outgoing and entry.proven:
                del pending[fd]
                poller.unregister(fd)
                log.debug("connection_accepted", peer=entry.peer, address=self.address)
                with self._cond:
                    self._ready.append(Connection(entry.sock,
                                                  default_timeout=self._default_timeout))
                    self._cond.notify()
                return
            if not entry.proven and mask & (select.POLLIN | select.POLLHUP | select.POLLERR):
                data = entry.sock.recv(ServerHandshake.REPLY)
                if not data:
                    raise ConnectionResetError("client left during the handshake")
                if hs.feed(data) == 0:
                    if not hs.verify(entry.peer):
                        self._drop(pending, poller, fd)
                        return
                    entry.proven = True
                    self._step(pending, poller, fd, 0)
                    return
            poller.modify(fd, select.POLLIN | (select.POLLOUT if hs.outgoing else 0))
        except (BlockingIOError, InterruptedError):
            if fd in pending:  # a full send buffer: write the rest when it drains
                with contextlib.suppress(OSError, ValueError):
                    poller.modify(fd, select.POLLIN | select.POLLOUT)
            return
        except OSError as exc:
            log.debug("handshake_failed", peer=entry.peer, error=str(exc))
            self._drop(pending, poller, fd)

    def _drop(self, pending: dict[int, _Pending], poller: select.poll, fd: int, *,
              count: bool = True) -> None:
        entry = pending.pop(fd)
        with contextlib.suppress(KeyError, ValueError, OSError):
            poller.unregister(fd)
        if count:  # before closing: the client may act on the EOF at once
            self.refused += 1
        entry.sock.close()


def connect(address: Address | str, *, token: bytes, timeout: float,
            default_timeout: float = DEFAULT_TIMEOUT) -> Connection:
    """Connect to a `Listener` at ``(host, port)`` (or ``"host:port"``) and authenticate."""
    check_token(token)
    if isinstance(address, str):
        host, _, port = address.rpartition(":")
        address = (host.strip("[]"), int(port))
    deadline = Deadline(timeout)
    try:
        sock = socket.create_connection(address, timeout=max(deadline.remaining(), 0.001))
    except TimeoutError as exc:
        raise CommTimeoutError(f"connect to {address} did not complete within "
                               f"{timeout:g} s") from exc
    except OSError as exc:
        raise PeerDiedError(f"expected a listener at {address}, got {exc}") from exc
    sock.setblocking(False)
    try:
        client_handshake(sock, bytes(token), deadline)
    except BaseException:
        sock.close()
        raise
    return Connection(sock, default_timeout=default_timeout)

