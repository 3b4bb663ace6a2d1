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
