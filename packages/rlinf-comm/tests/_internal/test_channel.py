"""Tests of rlinf.comm._internal.channel: named MPMC channels with payloads over shm/TCP."""

from __future__ import annotations

import asyncio
import gc
import json
import os
import signal
import subprocess
from pathlib import Path

import numpy as np
import pytest

from rlinf.comm import (
    AuthenticationError,
    Batch,
    Channel,
    ChannelClosedError,
    CommError,
    CommTimeoutError,
    Endpoint,
    PeerDiedError,
    TCPStore,
    new_token,
)
from rlinf.comm._internal import wire

from .deadlines import async_raises_timeout_within, raises_timeout_within
from .procs import spawn, stop


def mapped_segments(pid: int | str = "self") -> set[str]:
    names = set()
    with open(f"/proc/{pid}/maps") as maps:
        for line in maps:
            fields = line.split()
            if len(fields) >= 6 and fields[-1].startswith("/dev/shm/rlinf-"):
                names.add(fields[-1].removeprefix("/dev/shm/"))
    return names


def inside_shm(array: np.ndarray) -> bool:
    lo = array.ctypes.data
    with open("/proc/self/maps") as maps:
        for line in maps:
            fields = line.split()
            if len(fields) >= 6 and fields[-1].startswith("/dev/shm/rlinf-"):
                start, end = (int(x, 16) for x in fields[0].split("-"))
                if start <= lo and lo + array.nbytes <= end:
                    return True
    return False


def wait_exit(proc: subprocess.Popen, timeout: float = 60) -> None:
    try:
        assert proc.wait(timeout=timeout) == 0
    finally:
        proc.kill()


def test_put_get_in_one_process_is_zero_copy_and_reuses_segments(
    store: TCPStore, endpoint: Endpoint
) -> None:
    with Channel.create("c", store=store, maxsize=8) as producer:
        consumer = Channel.connect("c", store=store)
        data = np.arange(1 << 18, dtype=np.float32)
        for i in range(20):
            producer.put({"x": data + i}, weight=2, key="k")
            batch = consumer.get(key="k", timeout=10)
            assert np.array_equal(batch["x"], data + i)
            assert inside_shm(batch["x"])
            del batch
            gc.collect()
        producer.flush(timeout=10)  # every release came back to the producer
        # Released segments were reused: 20 puts did not need 20 segments.
        assert len(mapped_segments()) < 10
        consumer.disconnect()


def test_fifo_per_key_weights_and_state(store: TCPStore, endpoint: Endpoint) -> None:
    with Channel.create("c", store=store) as channel:
        for i in range(6):
            channel.put({"i": np.array([i])}, weight=i % 3 + 1, key="even" if i % 2 == 0 else "odd")
        assert channel.qsize() == 6
        assert channel.qsize(key="even") == 3
        assert channel.weight(key="odd") == 2 + 1 + 3
        assert [int(channel.get(key="odd")["i"][0]) for _ in range(2)] == [1, 3]
        got = channel.get_batch(target_weight=3, key="even")
        assert [int(b["i"][0]) for b in got] == [0, 2]  # weights 1 + 3 reach 3
        assert channel.qsize(key="even") == 1
        assert not channel.empty()


def test_a_handle_counts_the_weight_and_bytes_it_put(store: TCPStore, endpoint: Endpoint) -> None:
    """Small items on credit, a large one through shared memory, several at once: each
    counts its weight and array bytes (a flow measures its edges' bytes per item so)."""
    with Channel.create("c", store=store, maxsize=8) as owner:
        here = Channel.connect("c", store=store)
        assert here.sent == (0.0, 0)
        here.put({"x": np.zeros(4, np.int64)}, weight=2)
        here.put({"x": np.zeros(1 << 20, np.uint8), "y": np.zeros(3, np.float32)}, weight=1)
        here.put_many([{"x": np.zeros(2, np.int16)}] * 3, weights=[1, 1, 1])
        assert here.sent == (6.0, 32 + (1 << 20) + 12 + 3 * 4)
        assert owner.sent == (0.0, 0)  # a handle counts its own puts only
        owner.get_batch(target_weight=6, timeout=10)
        here.disconnect()


def test_back_pressure_put_times_out_when_full(store: TCPStore, endpoint: Endpoint) -> None:
    with Channel.create("c", store=store, maxsize=2) as channel:
        channel.put({"x": np.zeros(4)})
        channel.put({"x": np.ones(4)})
        assert channel.full()
        with pytest.raises(CommTimeoutError, match="only 0 went in"):
            channel.put({"x": np.zeros(4)}, timeout=0.2)
        assert channel.qsize() == 2  # the timed-out put left nothing behind
        assert np.array_equal(channel.get()["x"], np.zeros(4))
        channel.put({"x": np.full(4, 2.0)}, timeout=5)
        assert [float(channel.get()["x"][0]) for _ in range(2)] == [1.0, 2.0]


def test_timeouts_and_close_raise_typed_errors(store: TCPStore, endpoint: Endpoint) -> None:
    with Channel.create("c", store=store) as channel:
        with pytest.raises(CommTimeoutError):
            channel.get(timeout=0.1)
        with pytest.raises(CommTimeoutError):
            channel.get_batch(target_weight=2, timeout=0.1)
        channel.put({"x": np.zeros(1)})
        channel.close()
        assert channel.closed
        with pytest.raises(ChannelClosedError):
            channel.put({"x": np.zeros(1)})
        assert len(channel.get_batch(target_weight=5)) == 1  # drains what is left
        with pytest.raises(ChannelClosedError):
            channel.get(timeout=5)
    with pytest.raises(CommTimeoutError):
        Channel.connect("missing", store=store, timeout=0.1)
    with Channel.create("dup", store=store), pytest.raises(CommError, match="live process"):
        Channel.create("dup", store=store)
    Channel.create("dup", store=store).disconnect()  # the name is free again


def test_async_variants(store: TCPStore, endpoint: Endpoint) -> None:
    async def main(channel: Channel) -> list[int]:
        consumer = asyncio.create_task(channel.async_get_batch(target_weight=3, timeout=10))
        await asyncio.sleep(0)
        for i in range(3):
            await channel.async_put({"i": np.array([i])})
        one = [int(b["i"][0]) for b in await consumer]
        await channel.async_put({"i": np.array([9])})
        return [*one, int((await channel.async_get(timeout=10))["i"][0])]

    with Channel.create("c", store=store, maxsize=4) as channel:
        assert asyncio.run(main(channel)) == [0, 1, 2, 9]


def test_unauthenticated_clients_are_refused(store: TCPStore, endpoint: Endpoint) -> None:
    with Channel.create("c", store=store) as channel:
        address = tuple(json.loads(store.get("rlinf/comm/channel/c"))["address"])
        with pytest.raises(AuthenticationError):
            wire.connect(address, token=new_token(), timeout=10)
        channel.put({"x": np.zeros(1)})  # the owner keeps serving


def test_many_producers_and_consumers_lose_and_duplicate_nothing(
    store: TCPStore, endpoint: Endpoint, tmp_path: Path
) -> None:
    producers, per_producer, consumers = 2, 50_000, 2
    with Channel.create("mpmc", store=store, maxsize=2000) as channel:
        procs = [spawn("produce", store, "mpmc", f"producer-{p}", per_producer, 500)
                 for p in range(producers)]
        procs += [spawn("consume", store, "mpmc", f"consumer-{c}", 250, tmp_path / f"{c}.npy")
                  for c in range(consumers)]
        store.wait([f"produced/producer-{p}" for p in range(producers)], timeout=120)
        channel.close()
        for proc in procs:
            wait_exit(proc, timeout=120)
    received = [np.load(tmp_path / f"{c}.npy") for c in range(consumers)]
    everything = np.concatenate(received)
    assert len(everything) == producers * per_producer
    keys = everything[:, 0] * per_producer + everything[:, 1]
    assert len(np.unique(keys)) == len(keys)  # nothing duplicated, hence nothing lost
    for got in received:  # FIFO: each consumer sees each producer's items in order
        for p in range(producers):
            seqs = got[got[:, 0] == p, 1]
            assert np.all(np.diff(seqs) > 0)


@pytest.mark.parametrize("size", [8, 100_000])
def test_items_a_consumer_still_holds_are_never_overwritten(
    store: TCPStore, endpoint: Endpoint, size: int
) -> None:
    """Regression: with back-pressure the producer recycles released segments; an item the
    consumer still references must never be released, so its bytes must stay intact."""
    count = 40
    with Channel.create("hold", store=store, maxsize=4) as channel:
        proc = spawn("put_numbered", store, "hold", "producer-0", count, size)
        held = [channel.get(timeout=60)["x"] for _ in range(count)]
        corrupted = [i for i, x in enumerate(held) if not np.all(x == i)]
        assert corrupted == [], f"items overwritten under the consumer: {corrupted[:10]}"
        del held
        wait_exit(proc)


def test_killed_producer_leaves_no_segments_and_consumers_get_an_error(
    store: TCPStore, endpoint: Endpoint
) -> None:
    with Channel.create("c", store=store) as channel:
        proc = spawn("put_and_hang", store, "c", "producer-0", 3)
        try:
            segments = set(json.loads(store.get("segments/producer-0", timeout=60)))
            assert segments
            os.kill(proc.pid, signal.SIGKILL)
            proc.wait(timeout=10)
            # The producer's guardian unlinks its segments.
            _wait_until(lambda: not any(Path("/dev/shm", s).exists() for s in segments))
            # Whether the owner noticed first (its items are reported lost) or the consumer
            # finds the payload gone, the consumer learns who died.
            with pytest.raises(PeerDiedError, match="producer-0"):
                channel.get(timeout=30)
        finally:
            proc.kill()


def test_killed_consumer_releases_its_items_and_nothing_leaks(
    store: TCPStore, endpoint: Endpoint
) -> None:
    with Channel.create("c", store=store):
        producer = spawn("put_flush_exit", store, "c", "producer-0", 1)
        consumer = spawn("get_and_hang", store, "c", "consumer-0")
        try:
            segments = set(json.loads(store.get("segments/producer-0", timeout=60)))
            assert json.loads(store.get("held/consumer-0", timeout=60)) == 7
            os.kill(consumer.pid, signal.SIGKILL)
            consumer.wait(timeout=10)
            # The owner released the dead consumer's item, so the producer's flush returns.
            wait_exit(producer, timeout=60)
        finally:
            producer.kill()
            consumer.kill()
    assert segments
    _wait_until(lambda: not any(Path("/dev/shm", s).exists() for s in segments))


def test_tcp_path_to_a_consumer_on_another_node(
    store: TCPStore, endpoint: Endpoint, tmp_path: Path
) -> None:
    with Channel.create("c", store=store) as channel:
        proc = spawn("consume", store, "c", "consumer-remote", 1, tmp_path / "r.npy",
                     node="elsewhere")
        for seq in range(20):
            channel.put({"x": np.array([5, seq], dtype=np.int64)})
        channel.flush(timeout=60)
        channel.close()
        wait_exit(proc)
    got = np.load(tmp_path / "r.npy")
    assert got.tolist() == [[5, s] for s in range(20)]


def _wait_until(predicate, timeout: float = 30.0) -> None:
    import time

    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError("condition not reached in time")
        time.sleep(0.05)


def test_items_of_every_layout_round_trip(store: TCPStore, endpoint: Endpoint) -> None:
    torch = pytest.importorskip("torch")
    big = np.arange(3 << 20, dtype=np.float64).reshape(-1, 3)
    cases = [
        {"strided": np.arange(40, dtype=np.int16).reshape(4, 10)[:, ::3], "flag": np.array(True)},
        {"half": np.linspace(0, 1, 7, dtype=np.float16), "empty": np.zeros((0, 5), np.int8)},
        {"big_strided": big[:, 1], "big": big},  # > pack_bytes: a segment of its own
        {"rec": np.zeros(3, dtype=[("a", "<i4"), ("b", "<f8")])},  # codec path
        {"t": torch.arange(6, dtype=torch.bfloat16).reshape(2, 3)},  # torch: codec path
    ]
    with Channel.create("c", store=store) as producer:
        consumer = Channel.connect("c", store=store)
        producer.put_many([Batch(c, meta={"i": i}) for i, c in enumerate(cases)])
        got = consumer.get_batch(target_weight=len(cases), timeout=10)
        for i, (sent, batch) in enumerate(zip(cases, got, strict=True)):
            assert batch.meta == {"i": i}
            for name, array in sent.items():
                if isinstance(array, np.ndarray):
                    assert batch[name].dtype == array.dtype
                    assert np.array_equal(np.asarray(batch[name]), array)
                else:
                    assert torch.equal(torch.as_tensor(batch[name]), array)
        del got, batch
        consumer.disconnect()


@pytest.mark.parametrize("huge", [1e12, 1e308])
def test_a_huge_timeout_is_clamped_and_the_owner_keeps_its_deadlines(
    store: TCPStore, endpoint: Endpoint, huge: float
) -> None:
    """Regression: ``get(timeout=1e12)`` killed the owner's deadline thread with
    OverflowError; afterwards ``get(timeout=1)`` took 22 s and the next put was lost."""
    import threading
    import time

    with Channel.create("c", store=store) as channel:
        got: list[object] = []
        waiter = threading.Thread(target=lambda: got.append(channel.get(key="a", timeout=huge)))
        waiter.start()
        # the owner still expires short waits on time...
        started = time.monotonic()
        with pytest.raises(CommTimeoutError):
            channel.get(key="b", timeout=0.5)
        assert time.monotonic() - started < 3.0
        # ...and the parked huge-timeout get receives the next put
        channel.put({"x": np.arange(3)}, key="a")
        waiter.join(timeout=10)
        assert not waiter.is_alive() and np.array_equal(got[0]["x"], np.arange(3))  # type: ignore[index]
        channel.put({"x": np.ones(2)}, key="b")
        assert np.array_equal(channel.get(key="b", timeout=5)["x"], np.ones(2))


def test_bad_timeouts_are_refused_by_client_and_owner(store: TCPStore, endpoint: Endpoint) -> None:
    from rlinf.comm import InvalidArgumentError
    from rlinf.comm._internal.store import MAX_TIMEOUT_S, check_timeout

    assert check_timeout(1e308) == MAX_TIMEOUT_S
    with Channel.create("c", store=store) as channel:
        for bad in (float("nan"), -1.0, float("inf"), "soon", True):
            with pytest.raises(InvalidArgumentError, match="timeout"):
                channel.get(timeout=bad)  # type: ignore[arg-type]
        # also when an item waits (the owner's shortest path), which stays queued
        channel.put({"x": np.ones(2)}, timeout=5)
        with pytest.raises(InvalidArgumentError, match="timeout"):
            channel.get(timeout=-1.0)
        assert np.array_equal(channel.get(timeout=5)["x"], np.ones(2))
        # a client that skips its own checks: the owner refuses the request itself
        for bad in ("nan", -5, None):
            with pytest.raises(InvalidArgumentError, match="timeout"):
                channel._peer.call({"op": "get", "key": "k", "timeout": bad}, timeout=5)


def test_flush_after_the_owner_died_raises_peer_died_promptly(
    store: TCPStore, endpoint: Endpoint
) -> None:
    """Defect 7b: the owner's death ends a waiting flush with PeerDiedError, not a timeout."""
    import threading
    import time

    owner = Channel.create("c", store=store)
    producer = Channel.connect("c", store=store)
    try:
        # Nobody will consume it; 128 KiB stay in the producer's shared memory (a small
        # item would travel inline: the owner keeps it, and flush would not wait for it).
        producer.put({"x": np.zeros(1 << 14)})
        started = threading.Event()
        outcome: list[BaseException | None] = []

        def flush() -> None:
            started.set()
            try:
                producer.flush(timeout=60)
            except BaseException as exc:
                outcome.append(exc)
            else:
                outcome.append(None)

        waiter = threading.Thread(target=flush)
        waiter.start()
        started.wait(timeout=10)
        died = time.monotonic()
        owner.disconnect()  # the creator's handle stops the owner
        waiter.join(timeout=30)
        took = time.monotonic() - died
        assert outcome and isinstance(outcome[0], PeerDiedError), outcome
        assert "c" in str(outcome[0]) and "1" in str(outcome[0])
        assert took < 0.9, f"flush noticed the owner's death after {took:.2f} s"
        with pytest.raises(PeerDiedError):
            producer.flush(timeout=5)  # and at once when it is already gone
    finally:
        producer.disconnect()
        owner.disconnect()


def test_calls_return_within_their_timeout_while_the_owner_is_stopped_and_nothing_is_lost(
    store: TCPStore, endpoint: Endpoint
) -> None:
    import time

    """Defect 3: with the owner SIGSTOPped, get, get_batch, async_get, put and qsize return
    within their timeout plus 10% and 50 ms. Once it resumes, nothing is lost: the item a
    stalled get was handed late goes back to the head of its queue, the puts sent on credit
    go in, in order. A put on credit (room the owner reserved for this handle) needs no
    answer, so it returns at once; the first put beyond that room waits for more and times
    out within its bound, having put nothing in."""
    proc = spawn("own_channel_and_hang", store, "c", "owner-0", 4)
    try:
        store.get("ready/owner-0", timeout=60)
        channel = Channel.connect("c", store=store, timeout=30)
        channel.put({"x": np.array([1])}, key="k", timeout=10)
        stop(proc.pid)
        try:
            # The get on "k" and the put change the queue, so they get one try each.
            raises_timeout_within(0.5, lambda: channel.get(key="k", timeout=0.5))
            raises_timeout_within(
                0.3, lambda: channel.get_batch(target_weight=5, key="e", timeout=0.3), attempts=3)
            async_raises_timeout_within(
                0.3, lambda: channel.async_get(key="e", timeout=0.3), attempts=3)
            sent = [1]
            for value in range(2, 6):  # maxsize 4: the credit runs out by the fourth
                started = time.monotonic()
                try:
                    channel.put({"x": np.array([value])}, key="k", timeout=0.5)
                except CommTimeoutError:
                    assert time.monotonic() - started <= 1.1 * 0.5 + 0.05
                    break
                assert time.monotonic() - started < 0.5  # on credit: no answer awaited
                sent.append(value)
            else:
                raise AssertionError("every put went in while the owner was stopped")
            raises_timeout_within(0.4, lambda: channel.qsize(timeout=0.4), attempts=3)
            raises_timeout_within(0, lambda: channel.get(key="e", timeout=0), attempts=3)
        finally:
            os.kill(proc.pid, signal.SIGCONT)
        _wait_until(lambda: channel.qsize(key="k", timeout=10) == len(sent))
        got = [channel.get(key="k", timeout=10) for _ in sent]
        assert [int(b["x"][0]) for b in got] == sent
        assert channel.qsize(timeout=10) == 0
        del got
        gc.collect()
        channel.flush(timeout=10)  # both payloads came back: nothing held, nothing leaked
        channel.disconnect()
    finally:
        proc.kill()
        proc.wait(timeout=10)


def test_small_items_travel_inline_and_a_handle_in_the_owners_process_needs_no_socket(
    store: TCPStore, endpoint: Endpoint
) -> None:
    with Channel.create("c", store=store, maxsize=4) as owner:
        here = Channel.connect("c", store=store)  # same process: talks to the owner directly
        data = np.arange(16, dtype=np.int32)
        here.put({"x": data}, key="k")
        data[:] = -1  # the put copied it: the caller may reuse its array at once
        batch = owner.get(key="k", timeout=10)
        assert batch["x"].tolist() == list(range(16))
        assert not inside_shm(batch["x"]) and batch["x"].ctypes.data % 64 == 0
        assert owner._server is not None and owner._server._server.peers() == []
        here.disconnect()


def test_every_layout_from_another_process_round_trips(
    store: TCPStore, endpoint: Endpoint
) -> None:
    from .comm_workers import mixed_items

    expected = mixed_items() * 2
    with Channel.create("c", store=store, maxsize=2) as channel:  # credits run out often
        proc = spawn("put_mixed", store, "c", "producer-0")
        got = [channel.get(timeout=60) for _ in expected]
        for batch, (tensors, meta) in zip(got, expected, strict=True):
            assert dict(batch.meta) == meta
            for name, array in tensors.items():
                assert batch[name].dtype == array.dtype and batch[name].shape == array.shape
                assert np.array_equal(batch[name], array)
            assert inside_shm(batch["big"]) if "big" in tensors else True
        del got, batch
        gc.collect()
        wait_exit(proc)


def test_inline_items_outlive_their_killed_producer(store: TCPStore, endpoint: Endpoint) -> None:
    with Channel.create("c", store=store) as channel:
        proc = spawn("put_small_and_hang", store, "c", "producer-0", 3)
        try:
            store.get("put/producer-0", timeout=60)
            os.kill(proc.pid, signal.SIGKILL)
            proc.wait(timeout=10)
            # The owner holds their bytes: nothing was lost with the producer.
            assert [int(channel.get(timeout=30)["x"][0]) for _ in range(3)] == [0, 1, 2]
        finally:
            proc.kill()


def test_a_handle_that_only_gets_makes_no_shared_memory(store: TCPStore, endpoint: Endpoint
                                                        ) -> None:
    with Channel.create("c", store=store, maxsize=4) as channel:
        channel.put({"x": np.array([7])})
        proc = spawn("get_one_and_report", store, "c", "consumer-0")
        report = json.loads(store.get("report/consumer-0", timeout=60))
        assert report == {"x": 7, "guardian": False}
        wait_exit(proc)
