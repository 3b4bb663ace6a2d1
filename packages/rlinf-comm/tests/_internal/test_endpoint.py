"""Tests of rlinf.comm._internal.endpoint: point-to-point send/recv between processes."""

from __future__ import annotations

import gc
import os
import signal
import time

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

from .deadlines import raises_timeout_within
from .procs import spawn, stop


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


def test_messages_sent_before_close_are_delivered_after_the_sender_exits(
    store: TCPStore, endpoint: Endpoint
) -> None:
    """Defect 5: send then close (then exit) must not lose the message, and the sender's
    later sends must not overwrite it in a recycled segment."""
    rounds = 12
    proc = spawn("send_close_loop", store, "main", "leaver", rounds)
    assert proc.wait(timeout=120) == 0  # every sender closed and the process is gone
    for i in range(rounds):
        small = endpoint.recv(f"leaver-{i}", timeout=10)
        big = endpoint.recv(f"leaver-{i}", timeout=10)
        assert small["small"].tolist() == [i] * 16
        assert big["big"].shape == (1 << 20,)
        last = endpoint.recv(f"leaver-{i}", timeout=10)
        assert int(big["big"].min()) == int(big["big"].max()) == i % 251, f"round {i}"
        assert int(last["last"].min()) == int(last["last"].max()) == i % 251, f"round {i}"
        with pytest.raises(PeerDiedError, match=f"leaver-{i}"):
            endpoint.recv(f"leaver-{i}", timeout=10)  # nothing more: it left


def test_close_reports_a_live_peer_that_does_not_confirm_delivery(
    store: TCPStore, token: bytes
) -> None:
    """A peer that is alive but never reads: close gives up after its timeout and says so."""
    import json
    from dataclasses import replace

    from rlinf.comm._internal import wire
    from rlinf.comm._internal.locality import Locality

    with wire.Listener(token=token) as listener:
        mute = {"name": "mute", "address": list(listener.address),
                "locality": replace(Locality.current(), pid=1).to_dict()}
        store.set("rlinf/comm/endpoint/mute", json.dumps(mute).encode())
        sender = Endpoint("sender", store=store)
        sender.send({"x": np.arange(4)}, "mute", timeout=10)  # fits in the socket buffer
        accepted = listener.accept(timeout=10)  # authenticated, then never read
        started = time.monotonic()
        with pytest.raises(CommTimeoutError, match="'mute'"):
            sender.close(timeout=0.5)
        assert time.monotonic() - started < 5
        accepted.close()
    with pytest.raises(CommTimeoutError):
        store.get("rlinf/comm/endpoint/sender", timeout=0.1)  # it did leave
    with pytest.raises(CommError, match="closed"):
        sender.send({"x": np.arange(4)}, "mute", timeout=1)


def test_send_and_recv_return_within_their_timeout_while_the_peer_is_stopped(
    store: TCPStore, endpoint: Endpoint
) -> None:
    """Defect 3 for endpoints: with the peer SIGSTOPped, a recv that gets nothing and a send
    that fills the socket (TCP payload larger than the kernel buffers) raise within their
    timeout plus 10% and 50 ms."""
    proc = spawn("recv_and_hang", store, "main", "sleeper")
    try:
        endpoint.send({"x": np.ones(4)}, "sleeper", timeout=30)  # connected
        assert store.get("got/sleeper", timeout=30) == b"4"
        stop(proc.pid)
        try:
            raises_timeout_within(
                0.5, lambda: endpoint.recv("sleeper", timeout=0.5), attempts=3)
            beyond_socket_buffers = {"x": np.ones(4 << 20)}  # 32 MiB, made before timing
            raises_timeout_within(0.5, lambda: endpoint.send(
                beyond_socket_buffers, "sleeper", timeout=0.5, transport="tcp"))
        finally:
            os.kill(proc.pid, signal.SIGCONT)
    finally:
        proc.kill()
        proc.wait(timeout=10)
