"""Child processes for the multi-process endpoint and channel tests.

Run as a script: `python comm_workers.py ROLE STORE_ADDRESS [ARGS...]`, with the shared token
in env RLINF_COMM_TOKEN. Each role is a real rlinf.comm user in its own process; it reports
through the store (keys named in each role) and exits 0 on success.
"""

from __future__ import annotations

import json
import logging
import os
import sys
import time

import numpy as np
import structlog

from rlinf.comm import Batch, Channel, ChannelClosedError, Endpoint, TCPStore

structlog.configure(wrapper_class=structlog.make_filtering_bound_logger(logging.WARNING))


def mapped_segments(pid: int | str = "self") -> set[str]:
    """Names of the rlinf shared-memory segments a process has mapped."""
    names = set()
    with open(f"/proc/{pid}/maps") as maps:
        for line in maps:
            path = line.split()[-1] if len(line.split()) >= 6 else ""
            if path.startswith("/dev/shm/rlinf-"):
                names.add(path.removeprefix("/dev/shm/"))
    return names


def produce(store: TCPStore, channel_name: str, me: str, count: int, chunk: int) -> None:
    """Put `count` items {"x": [producer id, seq]} in chunks, then wait until all consumed."""
    ident = int(me.rsplit("-", 1)[-1])
    channel = Channel.connect(channel_name, store=store, timeout=60)
    for start in range(0, count, chunk):
        items = [{"x": np.array([ident, seq], dtype=np.int64)}
                 for seq in range(start, min(count, start + chunk))]
        channel.put_many(items, timeout=120)
    channel.flush(timeout=120)
    store.set(f"produced/{me}", b"")
    channel.disconnect()


def consume(store: TCPStore, channel_name: str, me: str, target: int, out_path: str) -> None:
    """get_batch until the channel is closed; save every (producer, seq) pair in order."""
    channel = Channel.connect(channel_name, store=store, timeout=60)
    pairs: list[np.ndarray] = []
    while True:
        try:
            batches = channel.get_batch(target_weight=target, timeout=120)
        except ChannelClosedError:
            break
        pairs.extend(np.array(b["x"]) for b in batches)  # copy, then the views die
        del batches
    np.save(out_path, np.stack(pairs) if pairs else np.empty((0, 2), dtype=np.int64))
    channel.disconnect()


def put_and_hang(store: TCPStore, channel_name: str, me: str, count: int) -> None:
    """Put `count` 1 MiB items, report the segments mapped, then wait to be killed."""
    channel = Channel.connect(channel_name, store=store, timeout=60)
    for i in range(count):
        channel.put({"x": np.full(1 << 20, i, dtype=np.uint8)}, timeout=60)
    store.set(f"segments/{me}", json.dumps(sorted(mapped_segments())).encode())
    time.sleep(120)


def put_flush_exit(store: TCPStore, channel_name: str, me: str, count: int) -> None:
    """Put `count` 1 MiB items, report the segments mapped, wait until all are released."""
    channel = Channel.connect(channel_name, store=store, timeout=60)
    for _ in range(count):
        channel.put({"x": np.full(1 << 20, 7, dtype=np.uint8)}, timeout=60)
    store.set(f"segments/{me}", json.dumps(sorted(mapped_segments())).encode())
    channel.flush(timeout=60)
    channel.disconnect()


def get_and_hang(store: TCPStore, channel_name: str, me: str) -> None:
    """Take one item and hold its views, report the segments mapped, wait to be killed."""
    channel = Channel.connect(channel_name, store=store, timeout=60)
    held = channel.get(timeout=60)
    store.set(f"held/{me}", json.dumps(int(held["x"][0])).encode())
    time.sleep(120)


def echo(store: TCPStore, peer: str, me: str, count: int) -> None:
    """Receive `count` batches from `peer` and send each one back, marked."""
    endpoint = Endpoint.current()
    for _ in range(count):
        batch = endpoint.recv(peer, timeout=60)
        reply = Batch({k: np.asarray(v) + 1 for k, v in batch.tensors.items()},
                      meta={**batch.meta, "echoed_by": me})
        endpoint.send(reply, peer, timeout=60)
    store.set(f"echo_done/{me}", b"")
    store.get(f"bye/{me}", timeout=60)


def recv_and_hang(store: TCPStore, peer: str, me: str) -> None:
    """Receive one batch, report, then wait to be killed while holding it."""
    endpoint = Endpoint.current()
    held = endpoint.recv(peer, timeout=60)
    store.set(f"got/{me}", str(int(held["x"].sum())).encode())
    time.sleep(120)


def put_numbered(store: TCPStore, channel_name: str, me: str, count: int, size: int) -> None:
    """Put items i = 0..count-1, each {"x": [i] * size}, then wait until all are released."""
    channel = Channel.connect(channel_name, store=store, timeout=60)
    for i in range(count):
        channel.put({"x": np.full(size, i, dtype=np.int64)}, timeout=60)
    channel.flush(timeout=120)
    channel.disconnect()


def send_close_loop(store: TCPStore, peer: str, me: str, rounds: int) -> None:
    """`rounds` times: a fresh endpoint sends `peer` a small (inline) and a 1 MiB (shared
    memory) batch, starts an isend and closes at once; then this process exits."""
    for i in range(rounds):
        with Endpoint(f"{me}-{i}", store=store) as endpoint:
            endpoint.send({"small": np.full(16, i, dtype=np.int64)}, peer, timeout=60)
            endpoint.send({"big": np.full(1 << 20, i % 251, dtype=np.uint8)}, peer, timeout=60)
            endpoint.isend({"last": np.full(2 << 20, i % 251, dtype=np.uint8)}, peer,
                           timeout=60)  # not waited for: close must finish it


def mixed_items() -> list[tuple[dict[str, np.ndarray], dict[str, object]]]:
    """Items of every layout a put may take: small ones inline (a 0-d, an empty, a strided,
    a datetime array), one over `eager_bytes` in shared memory; (arrays, meta) each."""
    grid = np.arange(40, dtype=np.int16).reshape(4, 10)
    return [
        ({"scalar": np.array(2.5), "empty": np.zeros((0, 3), np.int8)}, {"i": 0}),
        ({"strided": grid[:, ::3]}, {}),
        ({"when": np.arange(3).astype("M8[s]"), "flag": np.array([True, False])}, {"i": 2}),
        ({"big": np.arange(1 << 15, dtype=np.float64)}, {"i": 3}),
    ]


def put_mixed(store: TCPStore, channel_name: str, me: str) -> None:
    """Put `mixed_items()` one by one (dicts without meta, Batches with), then as one
    put_many, and wait until all were consumed."""
    channel = Channel.connect(channel_name, store=store, timeout=60)
    for tensors, meta in mixed_items():
        channel.put(Batch(tensors, meta=meta) if meta else tensors, timeout=60)
    channel.put_many([Batch(t, meta=m) for t, m in mixed_items()], timeout=60)
    channel.flush(timeout=120)
    channel.disconnect()


def put_small_and_hang(store: TCPStore, channel_name: str, me: str, count: int) -> None:
    """Put `count` small items (inline), report, then wait to be killed."""
    channel = Channel.connect(channel_name, store=store, timeout=60)
    for i in range(count):
        channel.put({"x": np.full(4, i, dtype=np.int64)}, timeout=60)
    channel.flush(timeout=60)  # the owner has them
    store.set(f"put/{me}", b"")
    time.sleep(120)


def get_one_and_report(store: TCPStore, channel_name: str, me: str) -> None:
    """Take one small item; report whether this process made any shared memory (a handle
    that only gets needs no credit word, hence no segment and no guardian)."""
    from rlinf.comm._internal.shm import _guardian

    channel = Channel.connect(channel_name, store=store, timeout=60)
    got = channel.get(timeout=60)
    store.set(f"report/{me}", json.dumps({"x": int(got["x"][0]),
                                          "guardian": _guardian.pid is not None}).encode())
    channel.disconnect()


def own_channel_and_hang(store: TCPStore, channel_name: str, me: str, maxsize: int) -> None:
    """Create the channel and serve it from this process until killed (or stopped)."""
    Channel.create(channel_name, store=store, maxsize=maxsize)
    store.set(f"ready/{me}", b"1")
    time.sleep(300)


def serve_store_and_hang(store: TCPStore, label: str, me: str) -> None:
    """Serve a second store from this process, publish its address, wait to be killed."""
    served = TCPStore.serve(timeout=60)
    store.set(f"store/{me}", served.address.encode())
    time.sleep(300)


ROLES = {
    "get_one_and_report": (get_one_and_report, (str, str)),
    "put_mixed": (put_mixed, (str, str)),
    "put_small_and_hang": (put_small_and_hang, (str, str, int)),
    "own_channel_and_hang": (own_channel_and_hang, (str, str, int)),
    "serve_store_and_hang": (serve_store_and_hang, (str, str)),
    "send_close_loop": (send_close_loop, (str, str, int)),
    "put_numbered": (put_numbered, (str, str, int, int)),
    "produce": (produce, (str, str, int, int)),
    "consume": (consume, (str, str, int, str)),
    "put_and_hang": (put_and_hang, (str, str, int)),
    "put_flush_exit": (put_flush_exit, (str, str, int)),
    "get_and_hang": (get_and_hang, (str, str)),
    "echo": (echo, (str, str, int)),
    "recv_and_hang": (recv_and_hang, (str, str)),
}


def main() -> None:
    role, address, *rest = sys.argv[1:]
    fn, types = ROLES[role]
    args = [t(a) for t, a in zip(types, rest, strict=True)]
    store = TCPStore(address)
    me = str(args[1])
    node = os.environ.get("RLINF_TEST_NODE")
    locality = None
    if node:  # pretend to live on another node: payloads then travel over TCP
        from dataclasses import replace

        from rlinf.comm._internal.locality import Locality

        locality = replace(Locality.current(), host_id=node)
    Endpoint(me, store=store, locality=locality).make_current()
    fn(store, *args)
    Endpoint.current().close()
    store.close()


if __name__ == "__main__":
    main()
