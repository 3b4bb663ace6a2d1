"""Move payloads between two processes: rlinf channel vs Ray, multiprocessing.Queue, Pipe, memcpy.

Launch: `tox -e bench-comm` (or `RAY_AUTH_MODE=disabled RAY_USAGE_STATS_ENABLED=0
.venv/bin/python benchmarks/bench_comm.py [--quick]`). Takes about 2-3 minutes on 2 cores.

**Throughput, 4 KiB to 256 MiB.** For each payload size a producer process sends `n` messages
holding one uint8 array of that size to a consumer process, which consumes each one; the
throughput of a trial is n * size / (time from the first send until the consumer reported
its last message consumed). Each system first runs one untimed warm-up trial per size; we
report the median over the timed trials, with the CPU-seconds per trial of every process the
system used (its helpers and daemons included). Systems:

- rlinf: `Channel.put` in the producer (one copy into a reused shared-memory segment, or the
  bytes inline in the message when small), `Channel.get` in the consumer (zero-copy view),
  maxsize=3 back-pressure; the channel is owned by its consumer's process, as the flow's
  channels are (`--owner producer` moves it to the producer);
- Ray: `ray.put` in a producer actor, the ObjectRef passed through a consumer actor's
  method, `ray.get` there (zero-copy for numpy), at most 3 messages ahead of the consumer;
- multiprocessing.Queue (maxsize=3): put in the producer, get in the consumer (pickled;
  since `put` pickles later in a feeder thread, the producer hands it a copy per message);
- memcpy: `np.copyto` of the same bytes into a warm buffer, single thread, in this process
  (the copy-bandwidth ceiling: every system above must copy the payload at least once).

How the consumer consumes, identically for every system: the producer stamps the message
index into the array's first 8 bytes; the consumer reads one 8-byte word from every 4 KiB
page of the received array (so every page must be mapped and resident in the consumer) and
sums them into a checksum that the producer verifies at the end. It then drops the array
(for rlinf that releases the segment back to the producer's pool).

**Small messages** (`--small-bytes`, default 4 KiB), contenders interleaved in rounds
(A B C D A B C D ..., `--rounds`), each round in a fresh pair of processes:

- `pipe_rtt`: a `multiprocessing.Pipe` round trip of pickled numpy (the floor a hand-written
  exchange reaches);
- `channel_rtt`: the channel path flow components use: `Channel.put` of the message into a
  channel owned by the other process, which `get`s it and `put`s it back into a channel owned
  by the first, which `get`s it;
- `channel_stream` / `mpq_stream`: `--small-messages` messages streamed through the channel
  (maxsize=3, owned by the consumer) and through `multiprocessing.Queue` (maxsize=3),
  consumed as above.

Each reports its median over the rounds and the CPU-seconds both processes spent per 1,000
messages (or round trips); the load average is printed beside. Latency vs Ray: the p50
round trip of a 4 KiB message by `Endpoint.send`/`recv` ping-pong vs a Ray actor call that
returns its 4 KiB argument.

The last line of output is one JSON object (ratios > 1 favour rlinf except the latency
ratios, where < 1 does; `zero_copy_receive` checks that the consumer's 64 MiB array lies
inside an rlinf shared-memory mapping, per /proc/self/maps).
"""

from __future__ import annotations

import argparse
import json
import logging
import multiprocessing as mp
import os
import statistics
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np
from process_cpu import tree_cpu_seconds

KiB, MiB = 1 << 10, 1 << 20
PAGE = 4096
INFLIGHT = 3  # messages a producer may have ahead of its consumer, for every system
SIZES = {"4KiB": 4 * KiB, "1MiB": MiB, "64MiB": 64 * MiB, "256MiB": 256 * MiB}


@dataclass(frozen=True)
class Plan:
    """Messages per trial and trials for one payload size."""

    label: str
    size: int
    messages: int
    trials: int

    @property
    def runs(self) -> int:
        """Trials plus one untimed warm-up run (warm pools and mappings, for every system)."""
        return self.trials + 1


@dataclass
class Rows:
    """What one system measured per payload size: MiB/s and CPU-seconds, per trial."""

    rate: dict[str, list[float]]
    cpu: dict[str, list[float]]

    @classmethod
    def empty(cls) -> Rows:
        return cls({}, {})

    def add(self, label: str, rate: float, cpu: float) -> None:
        self.rate.setdefault(label, []).append(rate)
        self.cpu.setdefault(label, []).append(cpu)

    def median(self, label: str) -> float:
        return statistics.median(self.rate[label]) if label in self.rate else float("nan")

    def median_cpu(self, label: str) -> float:
        return statistics.median(self.cpu[label]) if label in self.cpu else float("nan")


def make_plans(quick: bool) -> list[Plan]:
    scale = 0.25 if quick else 1.0
    counts = {"4KiB": 1000, "1MiB": 100, "64MiB": 8, "256MiB": 3}
    trials = 2 if quick else 3
    return [
        Plan(label, size, max(2, int(counts[label] * scale)), trials)
        for label, size in SIZES.items()
    ]


def size_label(nbytes: int) -> str:
    for unit, name in ((MiB, "MiB"), (KiB, "KiB")):
        if nbytes >= unit and nbytes % unit == 0:
            return f"{nbytes // unit}{name}"
    return f"{nbytes}B"


def quiet_logs() -> None:
    import structlog

    structlog.configure(
        wrapper_class=structlog.make_filtering_bound_logger(logging.WARNING),
        cache_logger_on_first_use=True,
    )


def cpu_seconds(pid: int) -> float:
    """User + system CPU-seconds of process `pid` so far, all its threads (from /proc)."""
    with open(f"/proc/{pid}/stat") as stat:
        fields = stat.read().rpartition(")")[2].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


# -- the consumption every system performs ------------------------------------------------
def stamp(array: np.ndarray, index: int) -> None:
    array[:8].view(np.uint64)[0] = index


def consume(array: np.ndarray) -> int:
    """Read one 8-byte word per 4 KiB page; returns their sum (mod 2**64)."""
    words = np.frombuffer(array, dtype=np.uint8)
    pages = words[: (len(words) // 8) * 8].view(np.uint64)[:: PAGE // 8]
    return int(pages.sum(dtype=np.uint64))


def expected_checksum(template: np.ndarray, n: int) -> int:
    total = 0
    for i in range(n):
        stamp(template, i)
        total += consume(template)
    return total % (1 << 64)


def make_source(size: int) -> np.ndarray:
    rng = np.random.default_rng(size)
    return rng.integers(0, 255, size=size, dtype=np.uint8)


def mib_per_s(size: int, n: int, seconds: float) -> float:
    return size * n / seconds / MiB


def check(got: int, want: int, system: str, label: str) -> None:
    if got != want:
        raise SystemExit(f"{system} {label}: expected checksum {want}, got {got}")


# -- memcpy ------------------------------------------------------------------------------
def bench_memcpy(plans: list[Plan]) -> Rows:
    rows = Rows.empty()
    for plan in plans:
        src, dst = make_source(plan.size), np.empty(plan.size, dtype=np.uint8)
        np.copyto(dst, src)  # warm: the destination pages exist
        reps = max(5, min(2000, (256 * MiB) // plan.size))
        for _ in range(9):  # cheap, so more samples: the machine is shared and noisy
            c0, t0 = time.process_time(), time.perf_counter()
            for _ in range(reps):
                np.copyto(dst, src)
            seconds = time.perf_counter() - t0
            # per `plan.messages` copies, like the other systems' trials
            cpu = (time.process_time() - c0) * plan.messages / reps
            rows.add(plan.label, mib_per_s(plan.size, reps, seconds), cpu)
    return rows


# -- multiprocessing.Queue -----------------------------------------------------------------
def _mpq_consumer(q: Any, done: Any, runs: list[tuple[int, int]]) -> None:
    for messages, repeats in runs:
        for _ in range(repeats):
            total = 0
            for _ in range(messages):
                total += consume(q.get())
            done.put(total % (1 << 64))


def bench_mp_queue(plans: list[Plan]) -> Rows:
    ctx = mp.get_context("spawn")
    q, done = ctx.Queue(maxsize=INFLIGHT), ctx.Queue()
    runs = [(plan.messages, plan.runs) for plan in plans]
    child = ctx.Process(target=_mpq_consumer, args=(q, done, runs), daemon=True)
    child.start()
    rows = Rows.empty()
    try:
        for plan in plans:
            src = make_source(plan.size)
            want = expected_checksum(src.copy(), plan.messages)
            for trial in range(plan.runs):
                seconds, cpu, got = _mpq_trial(q, done, src, plan.messages)
                if trial:  # the first run warms up
                    rows.add(plan.label, mib_per_s(plan.size, plan.messages, seconds), cpu)
                check(got, want, "multiprocessing.Queue", plan.label)
    finally:
        child.join(timeout=30)
        child.kill()
    return rows


def _mpq_trial(q: Any, done: Any, src: np.ndarray, messages: int) -> tuple[float, float, int]:
    """Stream `messages` copies of `src`; (seconds, CPU-seconds of both processes, checksum)."""
    c0, t0 = tree_cpu_seconds(), time.perf_counter()
    for i in range(messages):
        stamp(src, i)
        # Queue.put pickles later, in a feeder thread: hand it a private copy or the next
        # stamp would race the pickling.
        q.put(src.copy())
    got = done.get(timeout=300)
    seconds = time.perf_counter() - t0
    return seconds, tree_cpu_seconds() - c0, got


# -- rlinf ---------------------------------------------------------------------------------
def _mapped_shm_ranges() -> list[tuple[int, int]]:
    ranges = []
    with open("/proc/self/maps") as maps:
        for line in maps:
            if "/dev/shm/rlinf" in line:
                lo, hi = line.split()[0].split("-")
                ranges.append((int(lo, 16), int(hi, 16)))
    return ranges


def _rlinf_consumer(address: str, token_hex: str, plans: list[Plan], owner: bool) -> None:
    quiet_logs()
    from rlinf.comm import Channel, Endpoint, TCPStore

    token = bytes.fromhex(token_hex)
    store = TCPStore(address, token=token)
    endpoint = Endpoint("bench-consumer", store=store, token=token)
    endpoint.make_current()
    if owner:
        channel = Channel.create("bench", store=store, maxsize=INFLIGHT, endpoint=endpoint)
    else:
        channel = Channel.connect("bench", store=store, endpoint=endpoint, timeout=60)
    store.set("consumer_ready", b"")
    for plan in plans:
        for trial in range(plan.runs):
            store.set(f"ready/{plan.label}/{trial}", b"")
            total = 0
            for _ in range(plan.messages):
                batch = channel.get(timeout=300)
                array = batch["x"]
                total += consume(array)
                if plan.label == "64MiB" and trial == 0 and _ == 0:
                    address_ = array.ctypes.data
                    inside = any(lo <= address_ and address_ + array.nbytes <= hi
                                 for lo, hi in _mapped_shm_ranges())
                    store.set("zero_copy", b"1" if inside else b"0")
                del batch, array
            store.set(f"done/{plan.label}/{trial}", str(total % (1 << 64)).encode())
    # Latency: echo what the producer sends.
    for _ in range(int(store.get("pings", timeout=300))):
        endpoint.send(endpoint.recv("bench-producer", timeout=60), "bench-producer", timeout=60)
    store.get("bye", timeout=60)
    channel.disconnect()
    endpoint.close()
    store.close()


def bench_rlinf(plans: list[Plan], pings: int, *, owner: str) -> tuple[Rows, float, bool]:
    quiet_logs()
    from rlinf.comm import Channel, Endpoint, EndpointConfig, TCPStore, new_token

    token = new_token()
    store = TCPStore.serve(token=token)
    # Keep released segments warm: up to INFLIGHT + 2 payloads of 256 MiB (512 MiB
    # segments) are out at once, more than the pool's default 1 GiB of free segments.
    config = EndpointConfig(pool_free_bytes=4 << 30)
    endpoint = Endpoint("bench-producer", store=store, token=token, config=config)
    endpoint.make_current()
    producer_owns = owner == "producer"
    if producer_owns:
        channel = Channel.create("bench", store=store, maxsize=INFLIGHT, endpoint=endpoint)
    ctx = mp.get_context("spawn")
    child = ctx.Process(target=_rlinf_consumer, daemon=True,
                        args=(store.address, token.hex(), plans, not producer_owns))
    child.start()
    store.get("consumer_ready", timeout=120)
    if not producer_owns:
        channel = Channel.connect("bench", store=store, endpoint=endpoint, timeout=60)
    rows = Rows.empty()
    try:
        for plan in plans:
            src = make_source(plan.size)
            want = expected_checksum(src.copy(), plan.messages)
            for trial in range(plan.runs):
                store.get(f"ready/{plan.label}/{trial}", timeout=120)
                c0, t0 = tree_cpu_seconds(), time.perf_counter()
                for i in range(plan.messages):
                    stamp(src, i)
                    channel.put({"x": src}, timeout=120)
                got = int(store.get(f"done/{plan.label}/{trial}", timeout=300))
                seconds, cpu = time.perf_counter() - t0, tree_cpu_seconds() - c0
                if trial:  # the first run warms up
                    rows.add(plan.label, mib_per_s(plan.size, plan.messages, seconds), cpu)
                check(got, want, "rlinf", plan.label)
        zero_copy = store.get("zero_copy", timeout=60) == b"1"
        store.set("pings", str(pings).encode())
        ping = {"x": make_source(4 * KiB)}
        rtts = []
        for i in range(pings):
            t0 = time.perf_counter()
            endpoint.send(ping, "bench-consumer", timeout=60)
            endpoint.recv("bench-consumer", timeout=60)
            if i >= pings // 10:  # skip warm-up
                rtts.append(time.perf_counter() - t0)
        store.set("bye", b"")
        child.join(timeout=60)
    finally:
        child.kill()
        channel.disconnect()
        endpoint.close()
        store.close()
    return rows, statistics.median(rtts), zero_copy


# -- Ray -----------------------------------------------------------------------------------
def bench_ray(plans: list[Plan], pings: int) -> tuple[Rows, float]:
    import ray

    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False,
             object_store_memory=2 * 1024 * MiB)
    try:
        @ray.remote(num_cpus=0)
        class Consumer:
            def consume(self, refs: list[Any]) -> int:
                return consume(ray.get(refs[0]))

            def echo(self, array: np.ndarray) -> np.ndarray:
                return array

        @ray.remote(num_cpus=0)
        class Producer:
            def run(self, consumer: Any, size: int, n: int) -> tuple[float, int]:
                src = make_source(size)
                t0 = time.perf_counter()
                results = []
                for i in range(n):
                    stamp(src, i)
                    ref = ray.put(src)
                    results.append(consumer.consume.remote([ref]))
                    del ref
                    if len(results) > INFLIGHT:  # same in-flight bound as the channel
                        ray.wait([results[-INFLIGHT - 1]])
                total = sum(ray.get(results))
                return time.perf_counter() - t0, total % (1 << 64)

        consumer, producer = Consumer.remote(), Producer.remote()
        ray.get(producer.run.remote(consumer, 4 * KiB, 2))
        rows = Rows.empty()
        for plan in plans:
            want = expected_checksum(make_source(plan.size), plan.messages)
            for trial in range(plan.runs):
                c0 = tree_cpu_seconds()  # the driver and every Ray process it started
                seconds, got = ray.get(producer.run.remote(consumer, plan.size, plan.messages))
                cpu = tree_cpu_seconds() - c0
                check(got, want, "ray", plan.label)
                if trial:  # the first run warms up
                    rows.add(plan.label, mib_per_s(plan.size, plan.messages, seconds), cpu)
        ping = make_source(4 * KiB)
        rtts = []
        for i in range(pings):
            t0 = time.perf_counter()
            ray.get(consumer.echo.remote(ping))
            if i >= pings // 10:
                rtts.append(time.perf_counter() - t0)
        return rows, statistics.median(rtts)
    finally:
        ray.shutdown()


# -- small messages: round trips and streams, interleaved ------------------------------------
@dataclass(frozen=True)
class Small:
    """The small-message setting."""

    size: int
    """Bytes per message."""
    pings: int
    """Round trips per round of the round-trip contenders (the first tenth warms up)."""
    messages: int
    """Messages per stream (after an untimed warm-up stream of as many)."""


@dataclass(frozen=True)
class Sample:
    """One contender's result in one round."""

    seconds: float
    """Median round trip, or the time of the whole stream."""
    cpu_per_1k: float
    """CPU-seconds of both processes per 1,000 round trips or messages."""


def _pipe_echo(conn: Any, pings: int) -> None:
    for _ in range(pings):
        conn.send(conn.recv())
    conn.recv()  # the parent read our CPU time: exit


def pipe_rtt(small: Small) -> Sample:
    """Round trips of pickled numpy over a `multiprocessing.Pipe`."""
    ctx = mp.get_context("spawn")
    ours, theirs = ctx.Pipe()
    child = ctx.Process(target=_pipe_echo, args=(theirs, small.pings), daemon=True)
    child.start()
    assert child.pid is not None
    message = make_source(small.size)
    times, warm = [], small.pings // 10
    c0 = 0.0
    for i in range(small.pings):
        if i == warm:
            c0 = time.process_time() + cpu_seconds(child.pid)
        t0 = time.perf_counter()
        ours.send(message)
        ours.recv()
        if i >= warm:
            times.append(time.perf_counter() - t0)
    cpu = time.process_time() + cpu_seconds(child.pid) - c0
    ours.send(None)
    child.join(timeout=60)
    child.kill()
    return Sample(statistics.median(times), cpu / len(times) * 1000)


def _small_child(address: str, token_hex: str, role: str, small: Small) -> None:
    """The other process of a channel contender: `echo` (round trips) or `sink` (stream)."""
    quiet_logs()
    from rlinf.comm import Channel, Endpoint, TCPStore

    token = bytes.fromhex(token_hex)
    store = TCPStore(address, token=token)
    endpoint = Endpoint("small-child", store=store, token=token).make_current()
    if role == "echo":  # owns the channel it consumes, like a flow component's rank 0
        inbox = Channel.create("ping", store=store, endpoint=endpoint)
        outbox = Channel.connect("pong", store=store, endpoint=endpoint, timeout=60)
        store.set("child_ready", b"")
        for _ in range(small.pings):
            batch = inbox.get(timeout=60)
            outbox.put(batch, timeout=60)
            del batch
        outbox.disconnect()
    else:
        inbox = Channel.create("stream", store=store, maxsize=INFLIGHT, endpoint=endpoint)
        store.set("child_ready", b"")
        for run in range(2):  # a warm-up stream, then the timed one
            total = 0
            for _ in range(small.messages):
                batch = inbox.get(timeout=60)
                total += consume(batch["x"])
                del batch
            store.set(f"done/{run}", str(total % (1 << 64)).encode())
    store.get("bye", timeout=60)
    inbox.disconnect()
    endpoint.close()
    store.close()


class _ChannelPair:
    """This process's endpoint and a child process running `_small_child`."""

    def __init__(self, role: str, small: Small) -> None:
        from rlinf.comm import Endpoint, TCPStore, new_token

        token = new_token()
        self.store = TCPStore.serve(token=token)
        self.endpoint = Endpoint("small-parent", store=self.store, token=token).make_current()
        ctx = mp.get_context("spawn")
        self.child = ctx.Process(target=_small_child, daemon=True,
                                 args=(self.store.address, token.hex(), role, small))
        self.child.start()
        self.pid: int = self.child.pid  # type: ignore[assignment]

    def close(self, *channels: Any) -> None:
        self.store.set("bye", b"")
        self.child.join(timeout=60)
        self.child.kill()
        for channel in channels:
            channel.disconnect()
        self.endpoint.close()
        self.store.close()


def channel_rtt(small: Small) -> Sample:
    """put -> get -> put -> get between two processes, each channel owned by its consumer."""
    from rlinf.comm import Channel

    pair = _ChannelPair("echo", small)
    inbox = Channel.create("pong", store=pair.store, endpoint=pair.endpoint)
    pair.store.get("child_ready", timeout=120)
    outbox = Channel.connect("ping", store=pair.store, endpoint=pair.endpoint, timeout=60)
    message = {"x": make_source(small.size)}
    times, warm = [], small.pings // 10
    c0 = 0.0
    for i in range(small.pings):
        if i == warm:
            c0 = time.process_time() + cpu_seconds(pair.pid)
        t0 = time.perf_counter()
        outbox.put(message, timeout=60)
        batch = inbox.get(timeout=60)
        if i >= warm:
            times.append(time.perf_counter() - t0)
        del batch
    cpu = time.process_time() + cpu_seconds(pair.pid) - c0
    pair.close(outbox, inbox)
    return Sample(statistics.median(times), cpu / len(times) * 1000)


def channel_stream(small: Small) -> Sample:
    """`small.messages` puts into a channel of maxsize 3 that the consumer owns."""
    from rlinf.comm import Channel

    pair = _ChannelPair("sink", small)
    pair.store.get("child_ready", timeout=120)
    channel = Channel.connect("stream", store=pair.store, endpoint=pair.endpoint, timeout=60)
    src = make_source(small.size)
    want = expected_checksum(src.copy(), small.messages)
    for run in range(2):
        c0, t0 = time.process_time() + cpu_seconds(pair.pid), time.perf_counter()
        for i in range(small.messages):
            stamp(src, i)
            channel.put({"x": src}, timeout=60)
        got = int(pair.store.get(f"done/{run}", timeout=300))
        seconds = time.perf_counter() - t0
        cpu = time.process_time() + cpu_seconds(pair.pid) - c0
        check(got, want, "rlinf stream", size_label(small.size))
    pair.close(channel)
    return Sample(seconds, cpu / small.messages * 1000)


def mpq_stream(small: Small) -> Sample:
    """`small.messages` puts into a `multiprocessing.Queue` of maxsize 3."""
    ctx = mp.get_context("spawn")
    q, done = ctx.Queue(maxsize=INFLIGHT), ctx.Queue()
    child = ctx.Process(target=_mpq_consumer, args=(q, done, [(small.messages, 2)]),
                        daemon=True)
    child.start()
    src = make_source(small.size)
    want = expected_checksum(src.copy(), small.messages)
    try:
        for _ in range(2):  # a warm-up stream, then the timed one
            seconds, cpu, got = _mpq_trial(q, done, src, small.messages)
            check(got, want, "multiprocessing.Queue stream", size_label(small.size))
    finally:
        child.join(timeout=30)
        child.kill()
    return Sample(seconds, cpu / small.messages * 1000)


SMALL_CONTENDERS: dict[str, Callable[[Small], Sample]] = {
    "pipe_rtt": pipe_rtt, "channel_rtt": channel_rtt,
    "channel_stream": channel_stream, "mpq_stream": mpq_stream,
}


def bench_small(small: Small, rounds: int) -> tuple[dict[str, list[Sample]], list[float]]:
    """Every contender once per round, in the same order each round (A B C D A B C D ...)."""
    samples: dict[str, list[Sample]] = {name: [] for name in SMALL_CONTENDERS}
    loads = [os.getloadavg()[0]]
    for _ in range(rounds):
        for name, run in SMALL_CONTENDERS.items():
            samples[name].append(run(small))
            loads.append(os.getloadavg()[0])
    return samples, loads


def report_small(small: Small, samples: dict[str, list[Sample]],
                 loads: list[float]) -> dict[str, float]:
    label = size_label(small.size)
    med = {name: statistics.median(s.seconds for s in got) for name, got in samples.items()}
    cpu = {name: statistics.median(s.cpu_per_1k for s in got) for name, got in samples.items()}
    rate = {name: mib_per_s(small.size, small.messages, med[name])
            for name in ("channel_stream", "mpq_stream")}
    rounds = len(samples["pipe_rtt"])
    print(f"\n{label} messages between two processes, median of {rounds} interleaved rounds "
          f"(load average {min(loads):.1f}-{max(loads):.1f})")
    for name in ("pipe_rtt", "channel_rtt"):
        print(f"  {name:15s} round trip {med[name] * 1e6:8.1f} us   CPU {cpu[name]:.3f} s "
              f"per 1k round trips (both processes)")
    for name in ("channel_stream", "mpq_stream"):
        print(f"  {name:15s} {rate[name]:8.1f} MiB/s ({small.messages} messages in "
              f"{med[name] * 1e3:.0f} ms)   CPU {cpu[name]:.3f} s per 1k messages")
    return {
        f"pipe_rtt_us_{label}": round(med["pipe_rtt"] * 1e6, 1),
        f"channel_rtt_us_{label}": round(med["channel_rtt"] * 1e6, 1),
        f"latency_ratio_vs_pipe_{label}": round(med["channel_rtt"] / med["pipe_rtt"], 3),
        f"channel_stream_mib_s_{label}": round(rate["channel_stream"], 1),
        f"mp_queue_stream_mib_s_{label}": round(rate["mpq_stream"], 1),
        f"ratio_vs_mp_queue_{label}": round(rate["channel_stream"] / rate["mpq_stream"], 3),
        "small_load_average_max": round(max(loads), 2),
    }


# -- report --------------------------------------------------------------------------------
def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="fewer messages and trials")
    parser.add_argument("--pings", type=int, default=400,
                        help="round trips for the latency vs Ray")
    parser.add_argument("--skip-ray", action="store_true", help="leave out the Ray rows")
    parser.add_argument("--skip-sizes", action="store_true",
                        help="only the small-message contenders (no 4 KiB-256 MiB table)")
    parser.add_argument("--owner", choices=("consumer", "producer"), default="consumer",
                        help="the process that owns the channel of the throughput table")
    parser.add_argument("--small-bytes", type=int, default=4 * KiB,
                        help="bytes per message of the small-message contenders")
    parser.add_argument("--small-pings", type=int, default=2000,
                        help="round trips per round of pipe_rtt and channel_rtt")
    # 2,000 messages made a stream last tens of milliseconds, and one scheduling hiccup on a
    # shared box moved a round's ratio by half; 10,000 keep it within a few percent.
    parser.add_argument("--small-messages", type=int, default=10_000,
                        help="messages per stream of channel_stream and mpq_stream")
    parser.add_argument("--rounds", type=int, default=5,
                        help="interleaved rounds of the small-message contenders")
    args = parser.parse_args()
    os.environ.setdefault("RAY_AUTH_MODE", "disabled")
    os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
    quiet_logs()
    started = time.perf_counter()
    summary: dict[str, Any] = {}
    small = Small(args.small_bytes, args.small_pings, args.small_messages)
    samples, small_loads = bench_small(small, args.rounds)
    if not args.skip_sizes:
        summary.update(bench_sizes(make_plans(args.quick), args))
    summary.update(report_small(small, samples, small_loads))
    print(f"total time {time.perf_counter() - started:.0f} s")
    sys.stdout.flush()
    print(json.dumps(summary))


def bench_sizes(plans: list[Plan], args: argparse.Namespace) -> dict[str, Any]:
    """The throughput table, 4 KiB to 256 MiB, and the 4 KiB latency vs Ray."""
    loads = [os.getloadavg()[0]]
    memcpy = bench_memcpy(plans)
    rlinf, rlinf_rtt, zero_copy = bench_rlinf(plans, args.pings, owner=args.owner)
    loads.append(os.getloadavg()[0])
    mpq = bench_mp_queue(plans)
    loads.append(os.getloadavg()[0])
    if args.skip_ray:
        ray_rows, ray_rtt = Rows.empty(), float("nan")
    else:
        ray_rows, ray_rtt = bench_ray(plans, args.pings)
        loads.append(os.getloadavg()[0])
    systems = {"rlinf": rlinf, "ray": ray_rows, "mp.Queue": mpq, "memcpy": memcpy}
    print(f"\nthroughput between two processes, MiB/s (median of {plans[0].trials} trials; "
          f"{os.cpu_count()} cores; load average {min(loads):.1f}-{max(loads):.1f}; "
          f"channel owned by the {args.owner})")
    header = "".join(f"{name:>10}" for name in systems)
    print(f"{'payload':>8}{header} {'rlinf/ray':>10} {'rlinf/memcpy':>13}   "
          f"CPU-s per trial:{header}")
    for plan in plans:
        r, y, m = rlinf.median(plan.label), ray_rows.median(plan.label), memcpy.median(plan.label)
        rates = "".join(f"{rows.median(plan.label):10.0f}" for rows in systems.values())
        cpus = "".join(f"{rows.median_cpu(plan.label):10.2f}" for rows in systems.values())
        print(f"{plan.label:>8}{rates} {r / y:10.2f} {r / m:13.2f}   {'':16}{cpus}")
    print(f"\nround trip of a 4 KiB message, p50: rlinf endpoint {rlinf_rtt * 1e6:.0f} us, "
          f"ray actor call {ray_rtt * 1e6:.0f} us; zero-copy receive: {zero_copy}")
    return {
        "ratio_vs_ray_64MiB": round(rlinf.median("64MiB") / ray_rows.median("64MiB"), 3),
        "ratio_vs_memcpy_64MiB": round(rlinf.median("64MiB") / memcpy.median("64MiB"), 3),
        "latency_ratio_vs_ray_4KiB": round(rlinf_rtt / ray_rtt, 3),
        "zero_copy_receive": zero_copy,
        "sizes_load_average_max": round(max(loads), 2),
    }


if __name__ == "__main__":
    main()
