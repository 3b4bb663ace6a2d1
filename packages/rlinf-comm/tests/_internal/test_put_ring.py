"""Tests of rlinf.comm._internal.put_ring: small puts to an owner on this node through a
shared-memory ring, in order with the handle's frames, and rung while a get sleeps."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager

import numpy as np
import pytest

from rlinf.comm import Channel, CodecError, CommTimeoutError, Endpoint, TCPStore
from rlinf.comm._internal import channel_server
from rlinf.comm._internal.put_ring import SLOTS, RingReader, RingWriter


@pytest.fixture
def ring_pair() -> Iterator[tuple[RingWriter, RingReader]]:
    writer = RingWriter.create(4096)
    if writer is None:
        pytest.skip("no futexes here: channels put over their connections")
    reader = RingReader.attach(writer.offer())
    assert reader is not None
    yield writer, reader
    writer.close()
    reader.close()


def test_items_round_trip_with_their_layout(ring_pair: tuple[RingWriter, RingReader]) -> None:
    writer, reader = ring_pair
    odd = np.arange(13, dtype=np.int8)
    floats = np.linspace(0, 1, 7).reshape(7, 1)
    empty = np.zeros((0, 3), dtype=np.float32)
    items = [("k", 2.5, {"tensors": [["a", "|i1", [13]], ["b", "<f8", [7, 1]],
                                     ["e", "<f4", [0, 3]]], "meta": {"step": 3}},
              [odd, floats, empty]),
             ("other", 1.0, {"tensors": [["a", "|i1", [13]]], "meta": {}}, [odd])]
    for key, weight, descriptor, buffers in items:
        assert writer.try_put(0, key, weight, descriptor, buffers)
    got = reader.take(handled=0)
    assert [(g.key, g.weight, g.descriptor) for g in got] == [i[:3] for i in items]
    assert [bytes(b) for b in got[0].buffers] == [odd.tobytes(), floats.tobytes(), b""]
    assert all(b.readonly is False for b in got[0].buffers)  # the item's own bytes
    assert reader.take(handled=0) == []


def test_a_slot_waits_for_the_frames_sent_before_it(
        ring_pair: tuple[RingWriter, RingReader]) -> None:
    writer, reader = ring_pair
    descriptor = {"tensors": [["x", "<i8", [1]]], "meta": {}}
    assert writer.try_put(0, "k", 1.0, descriptor, [np.array([1])])
    assert writer.try_put(2, "k", 1.0, descriptor, [np.array([2])])  # after 2 frames
    assert [int(np.frombuffer(i.buffers[0], np.int64)[0]) for i in reader.take(1)] == [1]
    assert reader.take(1) == []  # frame 2 is not handled yet
    assert len(reader.take(2)) == 1


def test_a_full_ring_or_a_big_item_is_refused_not_waited_for(
        ring_pair: tuple[RingWriter, RingReader]) -> None:
    writer, reader = ring_pair
    descriptor = {"tensors": [["x", "|u1", [64]]], "meta": {}}
    small = np.zeros(64, np.uint8)
    assert all(writer.try_put(0, "k", 1.0, descriptor, [small]) for _ in range(SLOTS))
    assert not writer.try_put(0, "k", 1.0, descriptor, [small])
    big = np.zeros(writer.ring.capacity, np.uint8)
    assert not writer.try_put(0, "k", 1.0, {"tensors": [["x", "|u1", [big.size]]],
                                            "meta": {}}, [big])
    assert len(reader.take(0)) == SLOTS
    reader.close()
    assert not writer.try_put(0, "k", 1.0, descriptor, [small])  # the owner let go of it


def test_a_malformed_slot_is_a_codec_error(ring_pair: tuple[RingWriter, RingReader]) -> None:
    writer, reader = ring_pair
    assert writer.ring.try_put(b"\0" * 8 + b"\xff" * 40)  # counts past the slot
    with pytest.raises(CodecError, match="do not fit"):
        reader.take(0)


def test_a_slot_longer_than_the_slot_is_a_codec_error(
        ring_pair: tuple[RingWriter, RingReader]) -> None:
    writer, reader = ring_pair
    assert writer.ring.try_put(b"\0" * 64)
    start = 4096  # the header page, then slot 0: its 8-byte length first
    writer.ring._view[start:start + 8] = (writer.ring.slot_bytes * 2).to_bytes(8, "little")
    with pytest.raises(CodecError, match="more than its capacity"):
        reader.take(0)


@contextmanager
def socket_handle(store: TCPStore, name: str) -> Iterator[Channel]:
    """A handle on a channel owned in this process that talks to its owner over a socket,
    as one in another process on this node does."""
    saved = dict(channel_server._in_process)
    channel_server._in_process.clear()
    try:
        handle = Channel.connect(name, store=store, timeout=10)
    finally:
        channel_server._in_process.update(saved)
    try:
        yield handle
    finally:
        handle.disconnect()


def _values(batches: list) -> list[int]:
    return [int(b["x"][0]) for b in batches]


def test_small_puts_go_through_the_ring_in_order_with_the_others(
        store: TCPStore, endpoint: Endpoint) -> None:
    with Channel.create("c", store=store, maxsize=64) as owner, \
            socket_handle(store, "c") as producer:
        producer.put({"x": np.array([0])})
        assert producer._ring is not None
        conn = producer._peer.conn  # type: ignore[union-attr]
        sent = conn.frames_sent
        for i in range(1, 2 * SLOTS + 8):  # more than the ring holds: some go by socket
            producer.put({"x": np.array([i])})
        assert conn.frames_sent - sent <= 2 * SLOTS + 7 - (SLOTS - 1)  # a ring's worth did not
        producer.put_many([{"x": np.array([100])}, {"x": np.array([101])}])  # a socket put
        producer.put({"x": np.full(1 << 14, 102)})  # beyond the inline size: shared memory
        producer.put({"x": np.array([103])})
        producer.put({"x": np.array([7])}, key="other")
        deadline = time.monotonic() + 10  # cputs sent over the socket may be in flight
        while owner.qsize(timeout=10) < 2 * SLOTS + 8 + 4 + 1 and time.monotonic() < deadline:
            time.sleep(0.01)
        assert owner.qsize(timeout=10) == 2 * SLOTS + 8 + 4 + 1
        got = _values([owner.get(timeout=10) for _ in range(2 * SLOTS + 8 + 4)])
        assert got == [*range(2 * SLOTS + 8), 100, 101, 102, 103]
        assert _values([owner.get(key="other", timeout=10)]) == [7]


def test_a_sleeping_get_is_rung_for_a_ring_put(store: TCPStore, endpoint: Endpoint) -> None:
    with Channel.create("c", store=store, maxsize=4) as owner, \
            socket_handle(store, "c") as producer:
        producer.put({"x": np.array([0])})
        assert _values([owner.get(timeout=10)]) == [0] and producer._ring is not None
        got: list[int] = []
        getter = threading.Thread(target=lambda: got.extend(_values([owner.get(timeout=5)])))
        getter.start()
        server = owner._server
        assert server is not None
        deadline = time.monotonic() + 5
        while not any(server._getters.values()) and time.monotonic() < deadline:
            time.sleep(0.001)
        assert server._doorbells  # it sleeps: the ring asks for a doorbell
        producer.put({"x": np.array([1])})
        getter.join(10)
        assert got == [1]


def test_a_get_from_another_handle_is_served_from_the_ring(
        store: TCPStore, endpoint: Endpoint) -> None:
    with Channel.create("c", store=store, maxsize=4), \
            socket_handle(store, "c") as producer, socket_handle(store, "c") as consumer:
        got: list[int] = []
        getter = threading.Thread(target=lambda: got.extend(
            _values([consumer.get(timeout=5) for _ in range(3)])))
        getter.start()
        for i in range(3):
            producer.put({"x": np.array([i])})
            time.sleep(0.01)  # the get parks in between: each put is rung
        getter.join(10)
        assert got == [0, 1, 2] and producer._ring is not None


def test_a_ring_with_a_malformed_slot_is_dropped_and_puts_go_on_over_the_socket(
        store: TCPStore, endpoint: Endpoint) -> None:
    with Channel.create("c", store=store, maxsize=4) as owner, \
            socket_handle(store, "c") as producer:
        producer.put({"x": np.array([0])})
        assert _values([owner.get(timeout=10)]) == [0]
        ring = producer._ring
        assert ring is not None and owner._server is not None
        assert ring.ring.try_put(b"\0" * 8 + b"\xff" * 40)  # a broken producer's slot
        producer.put({"x": np.array([1])})  # behind the broken slot in the ring
        with pytest.raises(CommTimeoutError):  # the owner dropped the ring and its slots
            owner.get(timeout=0.5)
        assert owner._server._rings == {} and ring.ring.peer_closed
        producer.put({"x": np.array([2])})  # over the socket now
        assert _values([owner.get(timeout=10)]) == [2]
