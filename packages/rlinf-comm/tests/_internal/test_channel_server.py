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
    CodecError,
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


def test_a_get_that_waits_takes_the_puts_it_let_in_first(server: ChannelServer,
                                                         token: bytes) -> None:
    """Regression (FIFO): a get_batch that emptied the queue let a parked put in before it
    waited itself, so the put's items were queued behind its back and the next put's items
    reached it first (a consumer of the 100k-item test saw 2251 before 2002)."""
    producer, consumer = Client(server, token, "p"), Client(server, token, "c")
    producer.put(1, 2, 3, 4)  # full (maxsize 4)
    parked = producer.peer.call_async(
        {"op": "put", "key": "k", "items": [{"w": 1, "p": {"xid": 5}}], "timeout": 10})
    pending = consumer.get_async(target=6)  # takes 1-4, lets 5 in, waits for weight 6
    assert parked.result(timeout=10)[0]["accepted"] == 1
    producer.put(6)
    reply, _ = pending.result(timeout=10)
    assert xids(reply["items"]) == [1, 2, 3, 4, 5, 6]


INLINE = {"t": "inline", "d": {"tensors": [["x", "|u1", [3]]], "meta": {}}}


def test_inline_items_bring_their_bytes_need_no_release_and_outlive_their_producer(
        server: ChannelServer, token: bytes) -> None:
    producer, consumer = Client(server, token, "p"), Client(server, token, "c")
    reply, _ = producer.peer.call(
        {"op": "put", "key": "k", "timeout": 10,
         "items": [{"w": 1, "p": INLINE, "nb": 1}, {"w": 1, "p": {"xid": 7}},
                   {"w": 1, "p": INLINE, "nb": 1}]},
        [b"abc", b"xyz"], timeout=10)
    assert reply["accepted"] == 3
    producer.peer.close()  # its shared-memory item dies with it; the inline ones stay
    deadline = time.monotonic() + 10
    while len(server._clients) > 1 and time.monotonic() < deadline:
        time.sleep(0.005)
    with pytest.raises(PeerDiedError, match="1 of its queued items"):
        consumer.get(timeout=5)
    header = {"op": "get", "key": "k", "target_weight": 2, "timeout": 10}
    reply, buffers = consumer.peer.call(header, timeout=10)
    assert [item["nb"] for item in reply["items"]] == [1, 1]
    assert "pr" not in reply["items"][0] and reply["producers"] == []
    assert [bytes(b) for b in buffers] == [b"abc", b"xyz"]
    assert not server._clients[next(p for p in server._clients if p.name.endswith("c"))
                               ].delivered  # nothing to release


def test_a_put_whose_buffers_do_not_add_up_is_refused(server: ChannelServer,
                                                      token: bytes) -> None:
    producer = Client(server, token, "p")
    with pytest.raises(CodecError, match="buffers"):
        producer.peer.call({"op": "put", "key": "k", "timeout": 10,
                            "items": [{"w": 1, "p": INLINE, "nb": 2}]}, [b"abc"], timeout=10)
    assert server._count == 0


def test_unget_puts_inline_items_back_with_their_bytes(server: ChannelServer,
                                                       token: bytes) -> None:
    producer, consumer = Client(server, token, "p"), Client(server, token, "c")
    producer.peer.call({"op": "put", "key": "k", "timeout": 10,
                        "items": [{"w": 1, "p": INLINE, "nb": 1}, {"w": 1, "p": {"xid": 2}}]},
                       [b"abc"], timeout=10)
    reply, buffers = consumer.peer.call(
        {"op": "get", "key": "k", "target_weight": 2, "timeout": 10}, timeout=10)
    first, second = reply["items"]
    consumer.peer.notify({"op": "unget", "items": [
        {"uid": first["uid"], "key": "k", "w": 1, "p": first["p"], "nb": 1},
        {"uid": second["uid"]}]}, [bytes(buffers[0])])
    reply, buffers = consumer.peer.call(
        {"op": "get", "key": "k", "target_weight": 2, "timeout": 10}, timeout=10)
    assert reply["items"][0]["p"] == INLINE and bytes(buffers[0]) == b"abc"
    assert reply["items"][1]["p"] == {"xid": 2}


class CreditClient(Client):
    """A client that speaks the credit protocol (without a credit word)."""

    def __init__(self, server: ChannelServer, token: bytes, name: str) -> None:
        self.pushed = queue.SimpleQueue()
        conn = wire.connect(server.address, token=token, timeout=10)
        self.peer = RpcPeer(conn, name=name, on_message=self._on_push).start()
        self.peer.call({"op": "hello", "endpoint": {"name": name}, "credit": True}, timeout=10)

    def put_want(self, *payloads: int, want: int) -> Header:
        items = [{"w": 1, "p": {"xid": p}} for p in payloads]
        reply, _ = self.peer.call(
            {"op": "put", "key": "k", "items": items, "timeout": 10, "want": want}, timeout=20)
        return reply

    def cput(self, *payloads: int) -> None:
        self.peer.notify({"op": "cput", "key": "k",
                          "items": [{"w": 1, "p": {"xid": p}} for p in payloads]})

    def next_push(self, op: str) -> Header:
        while True:
            header = self.pushed.get(timeout=10)
            if header.get("op") == op:
                return header


def test_a_put_reserves_room_that_cputs_spend_without_an_answer(server: ChannelServer,
                                                                token: bytes) -> None:
    producer, consumer = CreditClient(server, token, "p"), Client(server, token, "c")
    assert producer.put_want(1, want=10)["grant"] == 3  # maxsize 4, one item in
    producer.cput(2, 3, 4)
    producer.peer.call({"op": "sync"}, timeout=10)  # every earlier frame was handled
    assert (server._count, server._granted) == (4, 0)
    assert xids(consumer.get(target=4)) == [1, 2, 3, 4]


def test_a_put_that_must_wait_has_unspent_credits_revoked(server: ChannelServer,
                                                          token: bytes) -> None:
    holder, other = CreditClient(server, token, "p"), Client(server, token, "p2")
    consumer = Client(server, token, "c")
    assert holder.put_want(1, want=10)["grant"] == 3  # 3 reserved, 1 queued: "full"
    waiting = other.peer.call_async(
        {"op": "put", "key": "k", "items": [{"w": 1, "p": {"xid": 9}}], "timeout": 10})
    holder.next_push("revoke")
    holder.cput(2)  # spent before it answers: still goes in
    holder.peer.notify({"op": "return", "n": 2})
    assert waiting.result(timeout=10)[0]["accepted"] == 1
    assert server._granted == 0
    reply, _ = consumer.peer.call({"op": "get", "key": "k", "target_weight": 3,
                                   "timeout": 10}, timeout=10)
    assert xids(reply["items"]) == [1, 2, 9]


def test_credit_clients_hear_of_the_close_and_cputs_sent_before_still_go_in(
        server: ChannelServer, token: bytes) -> None:
    producer, consumer = CreditClient(server, token, "p"), Client(server, token, "c")
    producer.put_want(1, want=2)
    consumer.peer.call({"op": "close"}, timeout=10)
    producer.next_push("closed")
    producer.cput(2)  # its room was reserved before the close
    producer.peer.call({"op": "sync"}, timeout=10)
    assert xids(consumer.get(target=5)) == [1, 2]
    with pytest.raises(ChannelClosedError):
        consumer.get()


def test_a_dead_clients_credits_go_back(server: ChannelServer, token: bytes) -> None:
    producer, other = CreditClient(server, token, "p"), Client(server, token, "p2")
    producer.put_want(1, want=10)
    assert server._granted == 3
    producer.peer.close()
    deadline = time.monotonic() + 10
    while server._granted and time.monotonic() < deadline:
        time.sleep(0.005)
    assert server._granted == 0
    assert other.put(2)["accepted"] == 1


def test_a_credit_word_is_topped_up_as_room_frees(server: ChannelServer, token: bytes) -> None:
    from rlinf.comm._internal.credit import CreditWord

    word = CreditWord.create()
    assert word is not None
    producer = CreditClient.__new__(CreditClient)
    producer.pushed = queue.SimpleQueue()
    conn = wire.connect(server.address, token=token, timeout=10)
    producer.peer = RpcPeer(conn, name="p", on_message=producer._on_push).start()
    producer.peer.call({"op": "hello", "endpoint": {"name": "p"}, "credit": True}, timeout=10)
    reply, _ = producer.peer.call({"op": "credit_word", "offer": word.offer()}, timeout=10)
    word.unlink()
    assert reply["mapped"] is True
    assert word.load() == 4  # granted at once (it offers a word when a put waits): all of it
    producer.cput(1, 2, 3, 4)
    producer.peer.call({"op": "sync"}, timeout=10)
    assert word.load() == 4 and server._count == 4  # full: nothing more
    consumer = Client(server, token, "c")
    assert xids(consumer.get(target=2)) == [1, 2]
    consumer.peer.call({"op": "sync"}, timeout=10)  # the get's handling is over
    assert word.load() == 6  # the room the get freed went to the word
    producer.cput(5, 6)  # full again
    assert xids(consumer.get()) == [3]
    consumer.peer.call({"op": "sync"}, timeout=10)
    assert word.load() == 7  # one free slot: granted at once (a busy producer finds it)
    word.close()


def test_a_credit_word_wakes_its_producer_only_while_one_sleeps(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """A grant is a store into the shared word; the system call that wakes is paid only
    while a producer thread says it sleeps there."""
    import threading
    import time

    from rlinf.comm._internal import credit

    word = credit.CreditWord.create()
    assert word is not None
    owner = credit.CreditWord.attach(word.offer())
    assert owner is not None
    wakes: list[int] = []
    real_wake = credit.futex.wake
    monkeypatch.setattr(credit.futex, "wake", lambda a: (wakes.append(a), real_wake(a)))
    owner.add(1)
    assert word.load() == 1 and wakes == []  # nobody sleeps: no system call
    credits = credit.Credits(bounded=True)
    credits.attach(word)
    assert credits.take(1)
    got: list[bool] = []
    waiter = threading.Thread(target=lambda: got.append(credits.wait_for_one(
        time.monotonic() + 10, check=lambda: None, ask=lambda: None)))
    waiter.start()
    deadline = time.monotonic() + 10
    while not owner._words[credit._SLEEPERS] and time.monotonic() < deadline:
        time.sleep(0.001)
    owner.add(1)  # the waiter sleeps (or is about to): woken
    waiter.join(10)
    assert got == [True] and wakes
    assert owner._words[credit._SLEEPERS] == 0  # it says it is awake again
    owner.close()
    word.unlink()
    word.close()


def test_a_local_get_settled_by_another_thread_wakes_its_reader(token: bytes) -> None:
    """A get of a handle in the owner's process waits reading the producers' connections;
    a put from another thread of the process (or a connection it does not read) must wake
    it, not leave it to its next 50 ms check."""
    import threading

    server = ChannelServer("t", token=token)
    try:
        consumer, producer = server.local_peer(name="c"), server.local_peer(name="p")
        for peer, name in ((consumer, "c"), (producer, "p")):
            peer.call({"op": "hello", "endpoint": {"name": name}}, timeout=5)
        woken: list[int] = []
        consumer._wake_readers = lambda: woken.append(threading.get_ident())  # type: ignore[method-assign]
        getter = server.get_local(consumer, key="k", target=None, timeout=10)
        putter = threading.Thread(target=lambda: producer.call(
            {"op": "put", "key": "k", "timeout": 5, "items": [{"w": 1, "p": {"xid": 1}}]},
            timeout=5))
        putter.start()
        putter.join()
        assert getter.outcome is not None and getter.outcome.done()
        assert [item.payload for item in getter.outcome.result()] == [{"xid": 1}]
        assert woken == [putter.ident]
    finally:
        server.shutdown()


def test_a_local_get_takes_a_queued_item_without_a_getter(token: bytes) -> None:
    """The stream's common case: an item waits, nobody else does; `take_local` hands it over
    at once. It declines (the full path decides) when a getter already waits on the key or
    nothing is queued."""
    server = ChannelServer("t", token=token)
    try:
        consumer, producer = server.local_peer(name="c"), server.local_peer(name="p")
        for peer, name in ((consumer, "c"), (producer, "p")):
            peer.call({"op": "hello", "endpoint": {"name": name}}, timeout=5)
        for xid in (1, 2):
            producer.call({"op": "put", "key": "k", "timeout": 5,
                           "items": [{"w": 1, "p": {"xid": xid}}]}, timeout=5)
        assert server.take_local(consumer, "k") is None, "a handle that never got is new"
        first = server.get_local(consumer, key="k", target=None, timeout=5)
        assert first.outcome is not None and first.outcome.done()
        assert [i.payload for i in first.outcome.result()] == [{"xid": 1}]
        taken = server.take_local(consumer, "k")
        assert taken is not None and taken.payload == {"xid": 2}
        assert server.take_local(consumer, "k") is None  # nothing queued
        waiting = server.get_local(consumer, key="k", target=None, timeout=5)
        producer.call({"op": "put", "key": "k", "timeout": 5,
                       "items": [{"w": 1, "p": {"xid": 3}}]}, timeout=5)
        assert waiting.outcome is not None and waiting.outcome.done()
        assert [i.payload for i in waiting.outcome.result()] == [{"xid": 3}]
        assert server._count == 0 and not server._getters.get("k")
    finally:
        server.shutdown()


def test_local_gets_leave_no_garbage_for_the_cyclic_collector(token: bytes) -> None:
    """A local get's getter and its outcome referred to each other: every get became garbage
    that only the cyclic collector frees (22 objects per get), which a process with a large
    heap pays for in full collections."""
    import gc

    server = ChannelServer("t", token=token)
    try:
        consumer, producer = server.local_peer(name="c"), server.local_peer(name="p")
        for peer, name in ((consumer, "c"), (producer, "p")):
            peer.call({"op": "hello", "endpoint": {"name": name}}, timeout=5)

        def exchange(n: int) -> None:
            for xid in range(n):
                waiting = server.get_local(consumer, key="k", target=None, timeout=5)
                producer.call({"op": "put", "key": "k", "timeout": 5,
                               "items": [{"w": 1, "p": {"xid": xid}}]}, timeout=5)
                assert waiting.outcome is not None and waiting.outcome.done()
                del waiting

        exchange(10)
        gc.collect()
        gc.disable()
        try:
            exchange(200)
            unreachable = gc.collect()
        finally:
            gc.enable()
        assert unreachable < 200, f"{unreachable} objects of cyclic garbage from 200 gets"
    finally:
        server.shutdown()


def _await_clients(server: ChannelServer, count: int) -> None:
    deadline = time.monotonic() + 10
    while len(server._clients) > count and time.monotonic() < deadline:
        time.sleep(0.005)
    assert len(server._clients) == count, "the owner never noticed a client leave"


def test_a_consumer_learns_at_once_that_its_item_will_never_be_sent(
        server: ChannelServer, token: bytes) -> None:
    """A producer that failed before it sent (its put could not be encoded) and died: the
    parked get fails at once instead of waiting out its timeout, once."""
    producer, consumer = Client(server, token, "p"), Client(server, token, "c")
    waiting = consumer.get_async(timeout=60)
    time.sleep(0.1)  # parked
    started = time.monotonic()
    producer.peer.close()
    with pytest.raises(PeerDiedError, match=r"no producer is left \('p', the last, left "
                                            r"without putting\)"):
        waiting.result(timeout=10)
    assert time.monotonic() - started < 5
    with pytest.raises(CommTimeoutError):  # told once; then the key is just empty
        consumer.get(timeout=0.1)


def test_a_get_after_the_last_producer_left_fails_at_once(server: ChannelServer,
                                                          token: bytes) -> None:
    producer, consumer = Client(server, token, "p"), Client(server, token, "c")
    producer.put(1)
    assert xids(consumer.get()) == [1]
    producer.peer.close()
    _await_clients(server, 1)
    started = time.monotonic()
    with pytest.raises(PeerDiedError, match=r"left after 1 put request"):
        consumer.get(timeout=30)
    assert time.monotonic() - started < 5
    # A producer that connects again ends it: the consumer waits for its items.
    again = Client(server, token, "p")
    pending = consumer.get_async(timeout=10)
    again.put(2)
    assert xids(pending.result(timeout=10)[0]["items"]) == [2]


def test_one_producer_leaving_while_another_may_put_fails_nobody(server: ChannelServer,
                                                                 token: bytes) -> None:
    first, second = Client(server, token, "p"), Client(server, token, "p")
    consumer = Client(server, token, "c")
    pending = consumer.get_async(timeout=10)
    first.put(1)
    assert xids(pending.result(timeout=10)[0]["items"]) == [1]
    first.peer.close()
    _await_clients(server, 2)
    with pytest.raises(CommTimeoutError):  # the second may still put: wait as asked
        consumer.get(timeout=0.3)
    second.put(2)
    assert xids(consumer.get()) == [2]


def test_a_consumer_that_asks_after_the_producer_left_learns_it_too(
        server: ChannelServer, token: bytes) -> None:
    producer, consumer = Client(server, token, "p"), Client(server, token, "c")
    producer.peer.close()  # before the consumer ever asked
    _await_clients(server, 1)
    started = time.monotonic()
    with pytest.raises(PeerDiedError, match="no producer is left"):
        consumer.get(timeout=30)
    assert time.monotonic() - started < 5


def test_a_producer_that_leaves_cleanly_orphans_nobody(server: ChannelServer,
                                                       token: bytes) -> None:
    """Producers that start one after another: the first says bye and leaves; the consumer
    waits for the next as asked."""
    first, consumer = Client(server, token, "p"), Client(server, token, "c")
    first.put(1)
    assert xids(consumer.get()) == [1]
    first.peer.notify({"op": "bye"})
    first.peer.close()
    _await_clients(server, 1)
    pending = consumer.get_async(timeout=10)
    time.sleep(0.2)
    Client(server, token, "p").put(2)
    assert xids(pending.result(timeout=10)[0]["items"]) == [2]
