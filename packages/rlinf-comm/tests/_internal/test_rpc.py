"""Tests of rlinf.comm._internal.rpc: calls, typed remote errors, deadlines."""

from __future__ import annotations

import threading
import time

import pytest

from rlinf.comm._internal import wire
from rlinf.comm._internal.rpc import Deadlines, RpcPeer, RpcServer
from rlinf.comm.errors import ChannelClosedError, CommTimeoutError, PeerDiedError


def test_calls_replies_errors_and_peer_death() -> None:
    token = wire.new_token()

    def handle(peer: RpcPeer, header: dict, buffers: list) -> None:
        if header["op"] == "echo":
            peer.reply(header, {"n": header["n"] + 1}, [bytes(buffers[0])[::-1]])
        elif header["op"] == "fail":
            peer.reply_error(header, ChannelClosedError("closed for good"))
        # "ignore": never answered

    server = RpcServer(name="t", token=token, on_message=handle)
    conn = wire.connect(server.address, token=token, timeout=10)
    client = RpcPeer(conn, name="server").start()
    try:
        reply, buffers = client.call({"op": "echo", "n": 1}, [b"abc"], timeout=10)
        assert reply["n"] == 2 and bytes(buffers[0]) == b"cba"
        with pytest.raises(ChannelClosedError, match="for good"):
            client.call({"op": "fail"}, timeout=10)
        with pytest.raises(CommTimeoutError, match="'ignore'"):
            client.call({"op": "ignore"}, timeout=0.1)
        pending = client.call_async({"op": "ignore"})
        server.close()
        with pytest.raises(PeerDiedError):
            pending.result(timeout=10)
        with pytest.raises(PeerDiedError):
            client.call({"op": "echo", "n": 1}, [b""], timeout=10)
    finally:
        client.close()
        server.close()


def test_deadlines_fire_in_order_and_cancel() -> None:
    deadlines = Deadlines(name="t")
    fired: list[str] = []
    done = threading.Event()
    now = time.monotonic()
    deadlines.schedule(now + 0.10, lambda: (fired.append("late"), done.set()))
    cancelled = deadlines.schedule(now + 0.02, lambda: fired.append("cancelled"))
    deadlines.schedule(now + 0.05, lambda: fired.append("early"))
    deadlines.cancel(cancelled)
    assert done.wait(10)
    assert fired == ["early", "late"]
    deadlines.close()


def test_a_server_side_direct_read_dispatches_in_the_calling_thread() -> None:
    """`RpcServer.read_direct`: a caller in the server's process reads its peers' frames
    itself; a write to the wake pipe ends the wait at once."""
    import os

    token = wire.new_token()
    seen: list[tuple[str, int]] = []

    def handle(peer: RpcPeer, header: dict, buffers: list) -> None:
        seen.append((header["op"], threading.get_ident()))

    server = RpcServer(name="t", token=token, on_message=handle)
    client = RpcPeer(wire.connect(server.address, token=token, timeout=10), name="s").start()
    wake_r, wake_w = os.pipe()
    try:
        deadline = time.monotonic() + 10
        while not server.peers() and time.monotonic() < deadline:
            time.sleep(0.005)
        # The peer's reader thread may take the first frame before we stand in: what is
        # checked is that frames sent while we read are dispatched, and by us.
        client.notify({"op": "a"})
        server.read_direct(lambda: len(seen) >= 1, deadline=time.monotonic() + 10,
                           wake_fd=wake_r)
        threading.Timer(0.05, client.notify, args=({"op": "b"},)).start()  # while we read
        server.read_direct(lambda: len(seen) >= 2, deadline=time.monotonic() + 10,
                           wake_fd=wake_r)
        assert [op for op, _ in seen] == ["a", "b"]
        assert seen[1][1] == threading.get_ident()
        settled = threading.Event()

        def settle() -> None:  # another thread settles what the reader waits for
            settled.set()
            os.write(wake_w, b"x")

        os.set_blocking(wake_r, False)
        threading.Timer(0.05, settle).start()
        started = time.monotonic()
        server.read_direct(settled.is_set, deadline=started + 30, wake_fd=wake_r)
        assert time.monotonic() - started < 10
        with pytest.raises(BlockingIOError):  # the wake-up was drained
            os.read(wake_r, 1)
    finally:
        client.close()
        server.close()
        os.close(wake_r)
        os.close(wake_w)
