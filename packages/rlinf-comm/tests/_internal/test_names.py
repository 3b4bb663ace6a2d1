"""Tests of rlinf.comm._internal.names: a dead holder's endpoint or channel name is taken
over (defect 4); a live holder's, even a stopped one, is not."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import time

import numpy as np
import pytest

from rlinf.comm import Channel, CommError, Endpoint, TCPStore
from rlinf.comm._internal import locality, names

from .procs import spawn, stop


def _kill(proc: subprocess.Popen) -> None:
    proc.kill()
    proc.wait(timeout=10)


def _wait_until(predicate, timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, "condition not reached in time"
        time.sleep(0.02)


def test_a_killed_endpoints_name_is_taken_over_and_its_peers_reach_the_new_holder(
    store: TCPStore, endpoint: Endpoint
) -> None:
    holder = spawn("recv_and_hang", store, "main", "worker-0")
    try:
        endpoint.send({"x": np.arange(4)}, "worker-0", timeout=60)
        assert store.get("got/worker-0", timeout=60) == b"6"
        with pytest.raises(CommError, match=r"worker-0.*live process"):
            Endpoint("worker-0", store=store)  # its holder is alive
        os.kill(holder.pid, signal.SIGKILL)
        holder.wait(timeout=10)
        # This process's connection to the old holder closes as the kernel ends it.
        _wait_until(lambda: "worker-0" not in endpoint._peers)
        with Endpoint("worker-0", store=store) as restarted:
            endpoint.send({"x": np.arange(3)}, "worker-0", timeout=30)
            got = restarted.recv("main", timeout=30)
            assert got["x"].tolist() == [0, 1, 2]
            record = json.loads(store.get("rlinf/comm/endpoint/worker-0", timeout=5))
            assert record["address"] == list(restarted.address)
    finally:
        _kill(holder)


def test_a_killed_owners_channel_is_created_again_and_clients_reach_the_new_one(
    store: TCPStore, endpoint: Endpoint
) -> None:
    owner = spawn("own_channel_and_hang", store, "c", "owner-0", 0)
    try:
        store.get("ready/owner-0", timeout=60)
        with pytest.raises(CommError, match=r"channel name 'c'.*live process"):
            Channel.create("c", store=store)
        os.kill(owner.pid, signal.SIGKILL)
        owner.wait(timeout=10)
        with Channel.create("c", store=store) as again:
            client = Channel.connect("c", store=store, timeout=10)
            client.put({"x": np.array([7])}, timeout=10)
            assert again.get(timeout=10)["x"].tolist() == [7]
            client.disconnect()
    finally:
        _kill(owner)


def test_a_stopped_holder_keeps_its_name(store: TCPStore, endpoint: Endpoint) -> None:
    """A holder that accepts but does not answer may be merely stalled: it is not robbed."""
    holder = spawn("own_channel_and_hang", store, "c", "owner-0", 0)
    try:
        store.get("ready/owner-0", timeout=60)
        stop(holder.pid)
        started = time.monotonic()
        with pytest.raises(CommError, match=r"owner-0.*live process"):
            Endpoint("owner-0", store=store)
        assert time.monotonic() - started < names.PROBE_TIMEOUT_S * 2 + 1
        with pytest.raises(CommError, match="live process"):
            Channel.create("c", store=store)
    finally:
        os.kill(holder.pid, signal.SIGCONT)
        _kill(holder)


def test_a_record_that_points_elsewhere_is_taken_over(store: TCPStore, endpoint: Endpoint) -> None:
    """A port reused by another listener (here: the store, which answers no whoami as
    that name) or an unreadable record does not keep a name taken."""
    store.set("rlinf/comm/endpoint/ghost", json.dumps(
        {"name": "ghost", "address": list(store.host_port)}).encode())
    store.set("rlinf/comm/endpoint/garbled", b"not json")
    for name in ("ghost", "garbled"):
        with Endpoint(name, store=store) as fresh:
            record = json.loads(store.get(f"rlinf/comm/endpoint/{name}", timeout=5))
            assert record["address"] == list(fresh.address)


def _silent_listener() -> socket.socket:
    """A listener that completes TCP connects but never answers: what a probe sees of a
    stalled holder, or of a loaded node's newcomer that reused a dead holder's port."""
    return socket.create_server(("127.0.0.1", 0), backlog=8)


def _dead_pid() -> int:
    proc = subprocess.Popen(["true"])
    proc.wait(timeout=10)
    return proc.pid


def test_a_dead_holder_of_this_node_loses_its_name_even_when_its_port_answers_nothing(
    store: TCPStore, endpoint: Endpoint
) -> None:
    """The stamp decides on the holder's own node; the probe (which would wait and then
    deem the silent listener alive) is not consulted."""
    here = locality.process_stamp()
    dead = {**here, "pid": _dead_pid()}
    reused_pid = {**here, "started": here["started"] - 1}  # this pid, an older process
    with _silent_listener() as silent:
        for name, stamp in (("dead", dead), ("reused", reused_pid)):
            store.set(f"rlinf/comm/endpoint/{name}", json.dumps(
                {"name": name, "address": list(silent.getsockname()), "process": stamp}
            ).encode())
            started = time.monotonic()
            with Endpoint(name, store=store) as fresh:
                assert time.monotonic() - started < names.PROBE_TIMEOUT_S
                record = json.loads(store.get(f"rlinf/comm/endpoint/{name}", timeout=5))
                assert record["address"] == list(fresh.address)
                assert record["process"] == here


def test_a_live_or_foreign_stamp_falls_back_on_the_probe(
    store: TCPStore, endpoint: Endpoint
) -> None:
    """A live process's stamp, or one from another kernel or pid namespace, proves nothing:
    the silent listener is then taken for a stalled live holder."""
    here = locality.process_stamp()
    foreign = {**here, "namespace": "another-boot/pid:[1]", "pid": _dead_pid()}
    with _silent_listener() as silent:
        for name, stamp in (("alive", here), ("foreign", foreign), ("unstamped", None)):
            store.set(f"rlinf/comm/endpoint/{name}", json.dumps(
                {"name": name, "address": list(silent.getsockname()), "process": stamp}
            ).encode())
            with pytest.raises(CommError, match=rf"{name}.*live process"):
                Endpoint(name, store=store)


def test_the_stamp_tells_a_pid_reused_by_a_newer_process() -> None:
    here = locality.process_stamp()
    assert not locality.stamped_process_gone(here)
    assert locality.stamped_process_gone({**here, "pid": _dead_pid()})
    assert locality.stamped_process_gone({**here, "started": here["started"] + 1})
    for proof_of_nothing in (None, {}, {**here, "namespace": ""}, {**here, "pid": "1"}):
        assert not locality.stamped_process_gone(proof_of_nothing)
