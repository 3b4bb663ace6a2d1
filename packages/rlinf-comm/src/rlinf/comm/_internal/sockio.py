"""Non-blocking socket I/O with deadlines, shared by connections and the handshake.

Sockets stay non-blocking; each call waits with ``poll`` for at most the time left, so a
`send` and a `recv` on one socket from two threads each keep their own timeout.
"""

from __future__ import annotations

import select
import socket
import time

from rlinf.comm.errors import CommTimeoutError, PeerDiedError

__all__ = ["IOV_MAX", "Deadline", "recv_exact_into", "send_all", "wait_fd"]

IOV_MAX = 512  # stay under the kernel's IOV_MAX (1024) per sendmsg call


class Deadline:
    """Remaining time of one blocking call."""

    __slots__ = ("at", "timeout")

    def __init__(self, timeout: float) -> None:
        self.timeout = timeout
        self.at = time.monotonic() + timeout

    def remaining(self) -> float:
        return self.at - time.monotonic()


def wait_fd(sock: socket.socket, events: int, deadline: Deadline, what: str) -> None:
    """Block until `sock` is ready for `events` or raise CommTimeoutError; `PeerDiedError`
    when another thread closed `sock` meanwhile (its descriptor is then -1)."""
    remaining = deadline.remaining()
    if remaining <= 0:
        raise CommTimeoutError(f"{what} did not complete within {deadline.timeout:g} s")
    poller = select.poll()
    try:
        poller.register(sock, events)
    except ValueError as exc:  # closed under us: a local close, not a bad argument
        raise PeerDiedError(f"{what}: the connection was closed locally") from exc
    if not poller.poll(max(1, int(remaining * 1000 + 0.999))):
        raise CommTimeoutError(f"{what} did not complete within {deadline.timeout:g} s")


def recv_exact_into(sock: socket.socket, view: memoryview, deadline: Deadline,
                     what: str) -> int:
    """Fill `view` from `sock`; returns bytes read before an error (for diagnostics)."""
    got = 0
    total = len(view)
    while got < total:
        try:
            n = sock.recv_into(view[got:] if got else view, total - got)
        except BlockingIOError:
            wait_fd(sock, select.POLLIN, deadline, what)
            continue
        except (ConnectionError, OSError) as exc:
            raise PeerDiedError(f"{what}: connection lost after {got} of {total} bytes "
                                f"({exc})") from exc
        if n == 0:
            raise PeerDiedError(f"{what}: peer closed the connection after {got} of "
                                f"{total} bytes")
        got += n
    return got


def send_all(sock: socket.socket, views: list[memoryview], deadline: Deadline,
              what: str, progress: list[int] | None = None) -> int:
    """Gather-send every view; returns the number of bytes sent.

    `progress[0]` tracks the bytes sent so far, so a caller can tell after an exception
    whether part of the frame already left.
    """
    sent_total = 0
    i = 0
    while i < len(views):
        chunk = views[i:i + IOV_MAX]
        try:
            sent = sock.sendmsg(chunk)
        except BlockingIOError:
            wait_fd(sock, select.POLLOUT, deadline, what)
            continue
        except (ConnectionError, OSError) as exc:
            raise PeerDiedError(f"{what}: connection lost after {sent_total} bytes "
                                f"({exc})") from exc
        sent_total += sent
        if progress is not None:
            progress[0] = sent_total
        # Skip fully sent views, trim the partially sent one.
        while sent and i < len(views):
            n = len(views[i])
            if sent >= n:
                sent -= n
                i += 1
            else:
                views[i] = views[i][sent:]
                sent = 0
    return sent_total

