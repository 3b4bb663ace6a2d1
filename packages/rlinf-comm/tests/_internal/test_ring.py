"""Tests of rlinf.comm._internal.ring: order, back-pressure, a dead peer surfacing as a
typed error naming it, and no /dev/shm name left behind."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from rlinf.comm import CommError, CommTimeoutError, InvalidArgumentError, PeerDiedError
from rlinf.comm._internal import futex
from rlinf.comm._internal.ring import RingClosedError, ShmRing

SHM = Path("/dev/shm")


def _consumer(offer: dict, script: str) -> subprocess.Popen[str]:
    """A process that attaches to `offer` as `ring` and runs `script`."""
    code = textwrap.dedent("""
        import json, sys
        from rlinf.comm._internal.ring import ShmRing
        ring = ShmRing.attach(json.loads(sys.argv[1]), peer="test producer")
    """) + textwrap.dedent(script)
    return subprocess.Popen([sys.executable, "-c", code, json.dumps(offer)],
                            stdout=subprocess.PIPE, text=True)


def _wait_until(predicate, timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, "condition not reached in time"
        time.sleep(0.01)


def test_futexes_are_available_on_this_linux() -> None:
    assert futex.available()


def test_items_arrive_in_order_across_many_wraps_in_one_process() -> None:
    with ShmRing.create(slots=4, slot_bytes=128) as producer, \
            ShmRing.attach(producer.offer()) as consumer:
        for i in range(1000):
            producer.put(i.to_bytes(4, "little") * (i % 30 + 1), timeout=1)
            if i % 3 == 2:  # leave some in the ring: the counters lead and lag
                for j in range(i - 2, i + 1):
                    assert consumer.get(timeout=1) == j.to_bytes(4, "little") * (j % 30 + 1)
        assert consumer.get(timeout=1) == (999).to_bytes(4, "little") * 10
        assert producer.pending() == 0


def test_a_full_ring_blocks_the_producer_until_the_timeout() -> None:
    with ShmRing.create(slots=2, slot_bytes=64) as producer, \
            ShmRing.attach(producer.offer()):
        producer.put(b"a", timeout=1)
        producer.put(b"b", timeout=1)
        started = time.monotonic()
        with pytest.raises(CommTimeoutError, match="full"):
            producer.put(b"c", timeout=0.2)
        assert time.monotonic() - started > 0.15  # it waited; a hang is pytest-timeout's


@pytest.mark.parametrize("bad", [float("nan"), -1.0, float("inf"), "soon"])
def test_a_bad_timeout_is_refused_instead_of_waiting_forever(bad: object) -> None:
    with ShmRing.create(slots=1, slot_bytes=64) as producer, \
            ShmRing.attach(producer.offer()) as consumer:
        with pytest.raises(InvalidArgumentError, match="timeout"):
            consumer.get(timeout=bad)  # type: ignore[arg-type]
        producer.put(b"a", timeout=1)
        with pytest.raises(InvalidArgumentError, match="timeout"):
            producer.put(b"b", timeout=bad)  # type: ignore[arg-type]
        assert bytes(consumer.get(timeout=1)) == b"a"


def test_an_oversized_payload_and_a_wrong_end_are_refused() -> None:
    with ShmRing.create(slots=2, slot_bytes=64) as producer, \
            ShmRing.attach(producer.offer()) as consumer:
        with pytest.raises(CommError, match="exceeds the slot capacity of 56"):
            producer.put(bytes(57), timeout=1)
        with pytest.raises(CommError, match="get on the producer"):
            producer.get(timeout=1)
        with pytest.raises(CommError, match="put on the consumer"):
            consumer.put(b"x", timeout=1)
    with pytest.raises(CommError, match="multiple of 64"):
        ShmRing.create(slot_bytes=100)


def test_a_closed_ring_hands_out_what_is_left_then_says_closed() -> None:
    producer = ShmRing.create(slots=4, slot_bytes=64)
    with ShmRing.attach(producer.offer(), peer="env-3") as consumer:
        producer.put(b"last", timeout=1)
        producer.close()
        assert consumer.get(timeout=1) == b"last"
        with pytest.raises(RingClosedError, match="'env-3' closed it"):
            consumer.get(timeout=5)


def test_the_name_is_gone_once_both_ends_mapped_it_and_a_stale_offer_says_so() -> None:
    producer = ShmRing.create(slots=2, slot_bytes=64)
    offer = producer.offer()
    assert (SHM / producer.name).exists()
    consumer = ShmRing.attach(offer)
    producer.put(b"x", timeout=1)
    assert not (SHM / producer.name).exists()  # unlinked, still mapped by both
    assert consumer.get(timeout=1) == b"x"
    producer.close()
    consumer.close()
    with pytest.raises(PeerDiedError, match="gone before it was attached"):
        ShmRing.attach(offer)


def test_another_process_receives_every_item_in_order() -> None:
    count = 20_000
    with ShmRing.create(slots=8, slot_bytes=256, peer="test consumer") as producer:
        consumer = _consumer(producer.offer(), f"""
            bad = 0
            for i in range({count}):
                got = ring.get(timeout=30)
                bad += got != i.to_bytes(8, "little") * (i % 20 + 1)
            print(bad, flush=True)
        """)
        try:
            for i in range(count):
                producer.put(i.to_bytes(8, "little") * (i % 20 + 1), timeout=30)
            out, _ = consumer.communicate(timeout=120)
        finally:
            consumer.kill()
        assert consumer.returncode == 0 and out.strip() == "0"
        assert not (SHM / producer.name).exists()


def test_a_killed_producer_surfaces_as_peer_died_naming_it() -> None:
    code = textwrap.dedent("""
        import json, sys, time
        from rlinf.comm._internal.ring import ShmRing
        ring = ShmRing.create(slots=2, slot_bytes=64)
        print(json.dumps(ring.offer()), flush=True)
        ring.put(b"one", timeout=10)
        time.sleep(600)
    """)
    producer = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True)
    try:
        assert producer.stdout is not None
        offer = json.loads(producer.stdout.readline())
        with ShmRing.attach(offer, peer="env worker 2") as consumer:
            assert consumer.get(timeout=30) == b"one"
            os.kill(producer.pid, signal.SIGKILL)
            producer.wait(timeout=10)
            started = time.monotonic()
            with pytest.raises(PeerDiedError, match=rf"'env worker 2' \(pid {producer.pid}\) died"):
                consumer.get(timeout=60)
            assert time.monotonic() - started < 5
    finally:
        producer.kill()
        producer.wait(timeout=10)
    _wait_until(lambda: not (SHM / offer["segment"]).exists())


def test_a_killed_consumer_surfaces_to_a_producer_blocked_on_a_full_ring() -> None:
    with ShmRing.create(slots=2, slot_bytes=64, peer="policy") as producer:
        consumer = _consumer(producer.offer(), """
            print("attached", flush=True)
            import time; time.sleep(600)
        """)
        try:
            assert consumer.stdout is not None and consumer.stdout.readline().strip() == "attached"
            producer.put(b"1", timeout=5)
            producer.put(b"2", timeout=5)
            consumer.kill()
            consumer.wait(timeout=10)
            with pytest.raises(PeerDiedError, match=rf"'policy' \(pid {consumer.pid}\) died"):
                producer.put(b"3", timeout=60)
        finally:
            consumer.kill()
            consumer.wait(timeout=10)


def test_a_spinning_consumer_gets_the_same_items(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("RLINF_COMM_RING_SPIN_US", "50")
    with ShmRing.create(slots=4, slot_bytes=64) as producer, \
            ShmRing.attach(producer.offer()) as consumer:
        assert consumer._spin_s == pytest.approx(50e-6) or consumer._spin_s == 0.0  # non-x86
        producer.put([b"ab", memoryview(b"cd")], timeout=1)
        assert consumer.get(timeout=1) == b"abcd"
        with pytest.raises(CommTimeoutError):
            consumer.get(timeout=0.1)


def test_an_offer_that_does_not_match_its_segment_is_refused() -> None:
    with ShmRing.create(slots=2, slot_bytes=64) as producer:
        for wrong in ({"slots": 4}, {"slot_bytes": 128}, {"slots": -1}):
            with pytest.raises(CommError, match="do not match the segment"):
                ShmRing.attach({**producer.offer(), **wrong})
        with pytest.raises(CommError, match="expected a ring offer"):
            ShmRing.attach({"segment": "../etc/passwd", "slots": 2, "slot_bytes": 64})
