"""Tests of rlinf.comm._internal.endpoint: point-to-point send/recv between processes."""

from __future__ import annotations

import gc
import os
import signal

import numpy as np
import pytest

from rlinf.comm import (
    Batch,
    CommError,
    CommTimeoutError,
    Endpoint,
    PeerDiedError,
    TCPStore,
    Work,
)

from .procs import spawn


@pytest.mark.parametrize(
    ("transport", "node"), [(None, None), ("tcp", None), (None, "elsewhere")]
)
def test_send_recv_round_trip_between_processes(
    store: TCPStore, endpoint: Endpoint, transport: str | None, node: str | None
) -> None:
    proc = spawn("echo", store, "main", "peer", 5, node=node)
    try:
        sent = []
        for i in range(5):
            batch = Batch({"a": np.arange(100_000, dtype=np.int64) * i,
                           "b": np.full((3, 4), i, dtype=np.float32)}, meta={"i": i})
            endpoint.send(batch, "peer", timeout=30, transport=transport)
            sent.append(batch)
        for i, batch in enumerate(sent):
            back = endpoint.recv("peer", timeout=30)
            assert back.meta == {"i": i, "echoed_by": "peer"}
            assert np.array_equal(back["a"], batch["a"] + 1)
            assert np.array_equal(back["b"], batch["b"] + 1)
        store.wait(["echo_done/peer"], timeout=30)
        store.set("bye/peer", b"")
        assert proc.wait(timeout=30) == 0
    finally:
        proc.kill()


def test_isend_irecv_return_work(store: TCPStore, endpoint: Endpoint) -> None:
    proc = spawn("echo", store, "main", "peer", 3)
    try:
        pending = endpoint.irecv("peer", timeout=30)
        assert isinstance(pending, Work)
        assert not pending.done()
        with pytest.raises(CommTimeoutError, match="still running"):
            pending.wait(timeout=0.05)
        sends = [endpoint.isend({"x": np.array([i])}, "peer", timeout=30) for i in range(3)]
        assert [s.wait(timeout=30) for s in sends] == [None, None, None]
        assert int(pending.wait(timeout=30)["x"][0]) == 1
        assert [int(endpoint.recv("peer", timeout=30)["x"][0]) for _ in range(2)] == [2, 3]
        assert pending.done()
        store.set("bye/peer", b"")
        assert proc.wait(timeout=30) == 0
    finally:
        proc.kill()


def test_timeouts_raise_typed_errors(store: TCPStore, endpoint: Endpoint) -> None:
    with pytest.raises(CommTimeoutError, match="nobody"):
        endpoint.recv("nobody", timeout=0.1)
    with pytest.raises(CommTimeoutError):
        endpoint.send({"x": np.zeros(1)}, "nobody", timeout=0.1)  # never registered
    work = endpoint.irecv("nobody", timeout=0.1)
    with pytest.raises(TimeoutError):
        work.wait()
    assert work.done()
    with pytest.raises(ValueError, match="finite"):
        endpoint.recv("nobody", timeout=float("inf"))
    with pytest.raises(CommError, match="free"):
        Endpoint("main", store=store)


def test_send_to_self_hands_over_in_process(store: TCPStore, endpoint: Endpoint) -> None:
    data = np.arange(10)
    endpoint.send({"x": data}, "main", timeout=5)
    got = endpoint.recv("main", timeout=5)
    assert np.array_equal(got["x"], data)


def test_released_segments_are_reused(store: TCPStore, endpoint: Endpoint) -> None:
    from rlinf.comm._internal import shm

    proc = spawn("echo", store, "main", "peer", 30)
    try:
        before = set(shm.default_pool().names())
        for i in range(30):
            endpoint.send({"x": np.full(2 << 20, i, dtype=np.uint8)}, "peer", timeout=30)
            back = endpoint.recv("peer", timeout=30)
            assert int(back["x"][0]) == i + 1
            del back
            gc.collect()
        created = set(shm.default_pool().names()) - before
        assert 0 < len(created) <= 4  # acks came back: 30 sends reused a few segments
        store.set("bye/peer", b"")
        assert proc.wait(timeout=30) == 0
    finally:
        proc.kill()


def test_killed_peer_surfaces_as_peer_died_naming_it(store: TCPStore, endpoint: Endpoint) -> None:
    proc = spawn("recv_and_hang", store, "main", "victim")
    try:
        endpoint.send({"x": np.ones(1 << 20)}, "victim", timeout=30)
        assert store.get("got/victim", timeout=30) == str(1 << 20).encode()
        pending = endpoint.irecv("victim", timeout=60)
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait(timeout=10)
        with pytest.raises(PeerDiedError, match="victim"):
            pending.wait(timeout=30)
        with pytest.raises(PeerDiedError, match="victim"):
            endpoint.send({"x": np.ones(4)}, "victim", timeout=10)
    finally:
        proc.kill()
