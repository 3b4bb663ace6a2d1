"""Tests of rlinf.comm._internal.channel_server: the descriptor queue behind a Channel.

These drive the owner with raw authenticated RPC clients, so they check its queue semantics
(FIFO per key, weights, back-pressure, deadlines, close, client death) independently of the
transports; tests/_internal/test_channel.py covers the whole path with payloads.
"""

from __future__ import annotations

import queue
import time
from collections.abc import Iterator

import pytest

from rlinf.comm._internal import wire
from rlinf.comm._internal.channel_server import ChannelServer
from rlinf.comm._internal.rpc import Buffers, Header, RpcPeer
from rlinf.comm.errors import (
    AuthenticationError,
    ChannelClosedError,
    CommTimeoutError,
    PeerDiedError,
)


class Client:
    """A raw channel client that records the releases the owner pushes to it."""

    def __init__(self, server: ChannelServer, token: bytes, name: str) -> None:
        self.pushed: queue.SimpleQueue[Header] = queue.SimpleQueue()
        conn = wire.connect(server.address, token=token, timeout=10)
        self.peer = RpcPeer(conn, name=name, on_message=self._on_push).start()
        self.peer.call({"op": "hello", "endpoint": {"name": name}}, timeout=10)

    def _on_push(self, peer: RpcPeer, header: Header, buffers: Buffers) -> None:
        self.pushed.put(header)

    def put(self, *payloads: int, key: str = "k", w: float = 1, timeout: float = 10) -> Header:
        items = [{"w": w, "p": {"xid": p}} for p in payloads]
        reply, _ = self.peer.call(
            {"op": "put", "key": key, "items": items, "timeout": timeout}, timeout=timeout + 10
        )
        return reply

    def get(self, key: str = "k", target: float | None = None, timeout: float = 10) -> list[Header]:
        header = {"op": "get", "key": key, "target_weight": target, "timeout": timeout}
        reply, _ = self.peer.call(header, timeout=timeout + 10)
        assert reply["producers"] == [{"name": "p"}] or not reply["items"]
        return list(reply["items"])

    def get_async(self, key: str = "k", target: float | None = None, timeout: float = 10):
        header = {"op": "get", "key": key, "target_weight": target, "timeout": timeout}
        return self.peer.call_async(header)

    def release(self, items: list[Header]) -> None:
        self.peer.notify({"op": "release", "uids": [i["uid"] for i in items]})

    def released(self, n: int) -> list[int]:
        out: list[int] = []
        while len(out) < n:
            out.extend(self.pushed.get(timeout=10)["xids"])
        return out


def xids(items: list[Header]) -> list[int]:
    return [i["p"]["xid"] for i in items]


@pytest.fixture
def token() -> bytes:
    return wire.new_token()


@pytest.fixture
def server(token: bytes) -> Iterator[ChannelServer]:
    srv = ChannelServer("test", token=token, maxsize=4)
    yield srv
    srv.shutdown()


def test_fifo_per_key_and_release_routing(server: ChannelServer, token: bytes) -> None:
    producer, consumer = Client(server, token, "p"), Client(server, token, "c")
    producer.put(1, 2, key="a")
    producer.put(3, key="b")
    assert xids(consumer.get("b")) == [3]
    got = consumer.get("a") + consumer.get("a")
    assert xids(got) == [1, 2]
    assert got[0]["pr"] == 0
    consumer.release(got)
    assert sorted(producer.released(2)) == [1, 2]


def test_get_batch_sums_weights_and_waits_for_more(server: ChannelServer, token: bytes) -> None:
    producer, consumer = Client(server, token, "p"), Client(server, token, "c")
    producer.put(1, w=2)
    pending = consumer.get_async(target=5)
    producer.put(2, w=2)
    assert not pending.done()
    producer.put(3, w=2)
    reply, _ = pending.result(timeout=10)
    assert xids(reply["items"]) == [1, 2, 3]  # 6 >= 5: stops at the first item reaching it


def test_back_pressure_blocks_then_admits_in_order(server: ChannelServer, token: bytes) -> None:
    producer, consumer = Client(server, token, "p"), Client(server, token, "c")
    producer.put(1, 2, 3, 4)
    # Full: a put that cannot fit times out, and nothing of it went in.
    reply = producer.put(5, timeout=0.2)
    assert (reply["accepted"], reply["timed_out"]) == (0, True)
    pending = producer.peer.call_async(
        {"op": "put", "key": "k", "items": [{"w": 1, "p": {"xid": 6}}], "timeout": 10}
    )
    assert not pending.done()
    assert xids(consumer.get()) == [1]
    assert pending.result(timeout=10)[0]["accepted"] == 1
    assert [xids(consumer.get())[0] for _ in range(4)] == [2, 3, 4, 6]


def test_timed_out_get_batch_gives_its_items_back(server: ChannelServer, token: bytes) -> None:
    producer, consumer = Client(server, token, "p"), Client(server, token, "c")
    producer.put(1, 2)
    with pytest.raises(CommTimeoutError, match="weight 2 of 3"):
        consumer.get(target=3, timeout=0.2)
    assert xids(consumer.get(target=2)) == [1, 2]
    with pytest.raises(CommTimeoutError):
        consumer.get(timeout=0.1)


def test_close_drains_then_raises(server: ChannelServer, token: bytes) -> None:
    producer, consumer = Client(server, token, "p"), Client(server, token, "c")
    producer.put(1, 2, 3)
    waiting = consumer.get_async(key="other")
    producer.peer.call({"op": "close"}, timeout=10)
    with pytest.raises(ChannelClosedError):
        waiting.result(timeout=10)
    with pytest.raises(ChannelClosedError):
        producer.put(4)
    assert xids(consumer.get()) == [1]
    assert xids(consumer.get(target=10)) == [2, 3]  # what is left, short of the target
    with pytest.raises(ChannelClosedError):
        consumer.get()


def test_dead_consumer_releases_what_it_held(server: ChannelServer, token: bytes) -> None:
    producer, consumer = Client(server, token, "p"), Client(server, token, "c")
    producer.put(1, 2)
    assert xids(consumer.get()) == [1]
    consumer.peer.close()  # dies without releasing item 1
    assert producer.released(1) == [1]
    # Its parked requests are gone: a new consumer gets the next item.
    assert xids(Client(server, token, "c2").get()) == [2]


def test_dead_producer_is_reported_to_consumers(server: ChannelServer, token: bytes) -> None:
    producer, consumer = Client(server, token, "p"), Client(server, token, "c")
    producer.put(1, 2)
    producer.peer.close()
    # The owner learns of the death on the producer's connection, concurrently with the
    # consumer's request on another: wait until it has, or the get may win the race.
    deadline = time.monotonic() + 10
    while len(server._clients) > 1 and time.monotonic() < deadline:
        time.sleep(0.005)
    assert len(server._clients) == 1, "the owner never noticed the producer's death"
    with pytest.raises(PeerDiedError, match="producer 'p' died and 2 of its queued items"):
        consumer.get(timeout=5)
    with pytest.raises(CommTimeoutError):  # reported once; then the key is just empty
        consumer.get(timeout=0.1)


def test_unauthenticated_clients_are_refused(server: ChannelServer, token: bytes) -> None:
    with pytest.raises(AuthenticationError):
        wire.connect(server.address, token=wire.new_token(), timeout=10)
    Client(server, token, "ok").put(1)  # and it keeps serving


def test_owner_shutdown_surfaces_as_peer_died(server: ChannelServer, token: bytes) -> None:
    consumer = Client(server, token, "c")
    waiting = consumer.get_async()
    server.shutdown()
    with pytest.raises(PeerDiedError):
        waiting.result(timeout=10)
