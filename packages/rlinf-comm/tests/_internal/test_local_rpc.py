"""Tests of rlinf.comm._internal.local_rpc: a connection to a server in this process."""

from __future__ import annotations

import threading
import time
from typing import Any

import pytest

from rlinf.comm._internal.local_rpc import LocalPeer
from rlinf.comm.errors import ChannelClosedError, CommError, CommTimeoutError, PeerDiedError


class Server:
    """Answers echo at once, parks "later" until `answer_parked`, fails "fail"."""

    def __init__(self) -> None:
        self.parked: list[tuple[Any, dict]] = []
        self.threads: list[int] = []
        self.closed: list[Any] = []

    def handle(self, peer: Any, header: dict, buffers: list) -> None:
        self.threads.append(threading.get_ident())
        if header["op"] == "echo":
            peer.reply(header, {"n": header["n"] + 1}, buffers)
        elif header["op"] == "later":
            self.parked.append((peer, header))
        elif header["op"] == "fail":
            peer.reply_error(header, ChannelClosedError("closed for good"))
        elif header["op"] == "push":
            peer.notify({"op": "pushed"})
        elif header["op"] == "boom":
            raise ValueError("handler bug")

    def answer_parked(self) -> None:
        peer, header = self.parked.pop()
        peer.reply(header, {"late": True})


def test_calls_run_the_handler_in_the_callers_thread_and_hand_objects_over() -> None:
    server = Server()
    pushed: list[dict] = []
    peer = LocalPeer(server.handle, name="srv", on_message=lambda p, h, b: pushed.append(h))
    buffer = bytearray(b"abc")
    reply, buffers = peer.call({"op": "echo", "n": 1}, [buffer], timeout=5)
    assert reply["n"] == 2 and buffers[0] is buffer  # nothing encoded or copied
    assert server.threads == [threading.get_ident()]
    with pytest.raises(ChannelClosedError, match="for good"):
        peer.call({"op": "fail"}, timeout=5)
    with pytest.raises(CommError, match="ValueError: handler bug"):  # as over a socket
        peer.call({"op": "boom"}, timeout=5)
    peer.notify({"op": "push"})
    assert pushed == [{"op": "pushed"}]


def test_an_answer_from_another_thread_ends_a_direct_read_at_once() -> None:
    server = Server()
    reads: list[float] = []

    def direct_read(done: Any, deadline: float, wake_fd: int) -> None:
        import select

        poller = select.poll()
        poller.register(wake_fd, select.POLLIN)
        while not done() and time.monotonic() < deadline:
            reads.append(time.monotonic())
            poller.poll(int((deadline - time.monotonic()) * 1000) + 1)

    peer = LocalPeer(server.handle, name="srv", direct_read=direct_read)
    fut = peer.call_async({"op": "later"})
    threading.Timer(0.05, server.answer_parked).start()
    started = time.monotonic()
    peer.read_direct(fut.done, deadline=started + 30)
    assert fut.result(timeout=0)[0]["late"]
    assert time.monotonic() - started < 5  # woken by the answer, not by the deadline
    with pytest.raises(CommTimeoutError):
        peer.call({"op": "later"}, timeout=0.05)


def test_closing_either_side_fails_what_waits() -> None:
    server = Server()
    gone: list[Any] = []
    left: list[Any] = []
    peer = LocalPeer(server.handle, name="srv", on_close=lambda p, e: gone.append(e),
                     server_closed=lambda p, e: left.append(p))
    waiting = peer.call_async({"op": "later"})
    peer.server_gone()
    with pytest.raises(PeerDiedError):
        waiting.result(timeout=5)
    assert len(gone) == 1 and not left
    with pytest.raises(PeerDiedError):
        peer.call({"op": "echo", "n": 1}, timeout=5)

    client = LocalPeer(server.handle, name="srv", server_closed=lambda p, e: left.append(p))
    client.close()
    assert left == [client.remote] and client.closed
    with pytest.raises(PeerDiedError):
        client.remote.notify({"op": "pushed"})  # the server cannot reach it any more
