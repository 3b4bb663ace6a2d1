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

import contextlib
import json
import select
import socket
import struct
import threading
from collections.abc import Sequence
from types import TracebackType
from typing import Any, Self

import pyarrow as pa
import structlog

from rlinf.comm._internal.auth import (
    TOKEN_ENV,
    check_token,
    client_handshake,
    default_token,
    new_token,
    server_handshake,
)
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
]

log = structlog.get_logger(__name__)

Address = tuple[str, int]

DEFAULT_TIMEOUT = 300.0
"""Seconds a call waits when given ``timeout=None`` (overridable per connection)."""

_MAGIC = b"RLF1"
_PREFIX = struct.Struct("!4sII")
_MAX_HEADER_BYTES = 64 << 20
_MAX_BUFFERS = 1 << 16
_ALIGN = 64  # Arrow's preferred buffer alignment; receivers decode zero-copy from it.
# One encoder for every frame: `json.dumps` with options builds a new one per call.
_encode_header = json.JSONEncoder(separators=(",", ":"), allow_nan=False).encode


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
        self._closed: str | None = None
        self.default_timeout = default_timeout
        self.max_frame_bytes = max_frame_bytes
        try:
            peer = sock.getpeername()
            self.peer_address: Address = (str(peer[0]), int(peer[1]))
        except OSError:
            self.peer_address = ("", 0)

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

    # -- receiving --------------------------------------------------------------------
    def recv(self, *, timeout: float | None = None) -> tuple[dict[str, Any], list[memoryview]]:
        """Receive one frame: its header and its buffers.

        The caller owns the returned buffers: writable memoryviews on one fresh,
        64-byte aligned allocation that lives as long as any view of it does.
        """
        deadline = self._deadline(timeout)
        with self._recv_lock:
            self._check_open()
            prefix = bytearray(_PREFIX.size)
            pview = memoryview(prefix)
            # Wait for the first byte without committing: a timeout here is harmless.
            first = 0
            while first == 0:
                try:
                    first = self._sock.recv_into(pview, _PREFIX.size)
                except BlockingIOError:
                    wait_fd(self._sock, select.POLLIN, deadline, "recv")
                    continue
                except (ConnectionError, OSError) as exc:
                    self.close("peer died")
                    raise PeerDiedError(f"recv from {self.peer_address}: {exc}") from exc
                if first == 0:
                    self.close("peer closed the connection")
                    raise PeerDiedError(f"peer {self.peer_address} closed the connection")
            try:
                return self._recv_rest(pview, first, deadline)
            except (CommTimeoutError, PeerDiedError, CodecError) as exc:
                self.close(f"recv failed mid-frame: {type(exc).__name__}")
                raise

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
        meta = bytearray(8 * nbuf + header_len)
        recv_exact_into(self._sock, memoryview(meta), deadline, "recv frame header")
        lengths = struct.unpack_from(f"!{nbuf}Q", meta)
        try:
            header = json.loads(meta[8 * nbuf:])
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


class Listener:
    """Accepts authenticated connections on a TCP port."""

    def __init__(self, host: str = "127.0.0.1", port: int = 0, *, token: bytes,
                 backlog: int = 128, default_timeout: float = DEFAULT_TIMEOUT,
                 handshake_timeout: float = 10.0) -> None:
        check_token(token)
        self._token = bytes(token)
        self._default_timeout = default_timeout
        # A client that connects and stays silent must not hold `accept` for long.
        self._handshake_timeout = handshake_timeout
        family = socket.AF_INET6 if ":" in host else socket.AF_INET
        self._sock = socket.create_server((host, port), family=family, backlog=backlog)
        self._sock.setblocking(False)
        bound = self._sock.getsockname()
        self.address: Address = (str(bound[0]), int(bound[1]))
        self._closed = False

    def accept(self, *, timeout: float | None = None) -> Connection:
        """Wait for one client and authenticate it before reading anything else.

        Raises `AuthenticationError` (after closing the socket) for a client that fails
        the handshake, `CommTimeoutError` when nobody completes it in time.
        """
        if self._closed:
            raise PeerDiedError(f"listener {self.address} is closed")
        deadline = Deadline(self._default_timeout if timeout is None else timeout)
        while True:
            try:
                sock, peer = self._sock.accept()
                break
            except BlockingIOError:
                wait_fd(self._sock, select.POLLIN, deadline, "accept")
            except OSError as exc:
                if self._closed:
                    raise PeerDiedError(f"listener {self.address} was closed") from exc
                raise
        sock.setblocking(False)
        try:
            budget = min(max(deadline.remaining(), 0.0), self._handshake_timeout)
            server_handshake(sock, self._token, Deadline(budget))
        except BaseException:
            sock.close()
            raise
        log.debug("connection_accepted", peer=peer, address=self.address)
        return Connection(sock, default_timeout=self._default_timeout)

    def close(self) -> None:
        if not self._closed:
            self._closed = True
            self._sock.close()

    def __enter__(self) -> Self:
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.close()


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

