"""Move payloads between two processes: rlinf channel vs Ray, multiprocessing.Queue, memcpy.

Launch: `tox -e bench-comm` (or `RAY_AUTH_MODE=disabled RAY_USAGE_STATS_ENABLED=0
.venv/bin/python benchmarks/bench_comm.py [--quick]`). Takes about 1-3 minutes on 2 cores.

For each payload size (4 KiB, 1 MiB, 64 MiB, 256 MiB) a producer process sends `n` messages
holding one uint8 array of that size to a consumer process, which consumes each one; the
throughput of a trial is n * size / (time from the first send until the consumer reported
its last message consumed). Each system first runs one untimed warm-up trial per size; we
report the median over the timed trials. Systems:

- rlinf: `Channel.put` in the producer (one copy into a reused shared-memory segment),
  `Channel.get` in the consumer (zero-copy view on the segment), maxsize=3 back-pressure;
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

Latency: the p50 round trip of a 4 KiB message: rlinf `Endpoint.send`/`recv` ping-pong
between the two processes vs a Ray actor call that returns its 4 KiB argument.

The last line of output is one JSON object (ratios > 1 favour rlinf except the latency
ratio, where < 1 does; `zero_copy_receive` checks that the consumer's array lies inside an
rlinf shared-memory mapping, per /proc/self/maps).
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
from dataclasses import dataclass
from typing import Any

import numpy as np

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


def make_plans(quick: bool) -> list[Plan]:
    scale = 0.25 if quick else 1.0
    counts = {"4KiB": 1000, "1MiB": 100, "64MiB": 8, "256MiB": 3}
    trials = 2 if quick else 3
    return [
        Plan(label, size, max(2, int(counts[label] * scale)), trials)
        for label, size in SIZES.items()
    ]


def quiet_logs() -> None:
    import structlog

    structlog.configure(
        wrapper_class=structlog.make_filtering_bound_logger(logging.WARNING),
        cache_logger_on_first_use=True,
    )


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


# -- memcpy ------------------------------------------------------------------------------
def bench_memcpy(plans: list[Plan]) -> dict[str, float]:
    out = {}
    for plan in plans:
        src, dst = make_source(plan.size), np.empty(plan.size, dtype=np.uint8)
        np.copyto(dst, src)  # warm: the destination pages exist
        reps = max(5, min(2000, (256 * MiB) // plan.size))
        samples = []
        for _ in range(9):  # cheap, so more samples: the machine is shared and noisy
            t0 = time.perf_counter()
            for _ in range(reps):
                np.copyto(dst, src)
            samples.append(mib_per_s(plan.size, reps, time.perf_counter() - t0))
        out[plan.label] = statistics.median(samples)
    return out


# -- multiprocessing.Queue -----------------------------------------------------------------
def _mpq_consumer(q: Any, done: Any, plans: list[Plan]) -> None:
    for plan in plans:
        for _ in range(plan.runs):
            total = 0
            for _ in range(plan.messages):
                total += consume(q.get())
            done.put(total % (1 << 64))


def bench_mp_queue(plans: list[Plan]) -> dict[str, float]:
    ctx = mp.get_context("spawn")
    q, done = ctx.Queue(maxsize=INFLIGHT), ctx.Queue()
    child = ctx.Process(target=_mpq_consumer, args=(q, done, plans), daemon=True)
    child.start()
    out = {}
    try:
        for plan in plans:
            src = make_source(plan.size)
            want = expected_checksum(src.copy(), plan.messages)
            samples = []
            for trial in range(plan.runs):
                t0 = time.perf_counter()
                for i in range(plan.messages):
                    stamp(src, i)
                    # Queue.put pickles later, in a feeder thread: hand it a private copy
                    # or the next stamp would race the pickling.
                    q.put(src.copy())
                got = done.get(timeout=300)
                if trial:  # the first run warms up
                    samples.append(mib_per_s(plan.size, plan.messages, time.perf_counter() - t0))
                check(got, want, "multiprocessing.Queue", plan)
            out[plan.label] = statistics.median(samples)
    finally:
        child.join(timeout=30)
        child.kill()
    return out


def check(got: int, want: int, system: str, plan: Plan) -> None:
    if got != want:
        raise SystemExit(f"{system} {plan.label}: expected checksum {want}, got {got}")


# -- rlinf ---------------------------------------------------------------------------------
def _mapped_shm_ranges() -> list[tuple[int, int]]:
    ranges = []
    with open("/proc/self/maps") as maps:
        for line in maps:
            if "/dev/shm/rlinf" in line:
                lo, hi = line.split()[0].split("-")
                ranges.append((int(lo, 16), int(hi, 16)))
    return ranges


def _rlinf_consumer(address: str, token_hex: str, plans: list[Plan]) -> None:
    quiet_logs()
    from rlinf.comm import Channel, Endpoint, TCPStore

    store = TCPStore(address, token=bytes.fromhex(token_hex))
    endpoint = Endpoint("bench-consumer", store=store, token=bytes.fromhex(token_hex))
    endpoint.make_current()
    channel = Channel.connect("bench", store=store, endpoint=endpoint)
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
    channel.disconnect()
    store.get("bye", timeout=60)
    endpoint.close()
    store.close()


def bench_rlinf(plans: list[Plan], pings: int) -> tuple[dict[str, float], float, bool]:
    quiet_logs()
    from rlinf.comm import Channel, Endpoint, EndpointConfig, TCPStore, new_token

    token = new_token()
    store = TCPStore.serve(token=token)
    # Keep released segments warm: up to INFLIGHT + 2 payloads of 256 MiB (512 MiB
    # segments) are out at once, more than the pool's default 1 GiB of free segments.
    config = EndpointConfig(pool_free_bytes=4 << 30)
    endpoint = Endpoint("bench-producer", store=store, token=token, config=config)
    endpoint.make_current()
    channel = Channel.create("bench", store=store, maxsize=INFLIGHT, endpoint=endpoint)
    ctx = mp.get_context("spawn")
    address = store.address
    child = ctx.Process(target=_rlinf_consumer, args=(address, token.hex(), plans), daemon=True)
    child.start()
    out = {}
    try:
        for plan in plans:
            src = make_source(plan.size)
            want = expected_checksum(src.copy(), plan.messages)
            samples = []
            for trial in range(plan.runs):
                store.get(f"ready/{plan.label}/{trial}", timeout=120)
                t0 = time.perf_counter()
                for i in range(plan.messages):
                    stamp(src, i)
                    channel.put({"x": src}, timeout=120)
                got = int(store.get(f"done/{plan.label}/{trial}", timeout=300))
                if trial:  # the first run warms up
                    samples.append(mib_per_s(plan.size, plan.messages, time.perf_counter() - t0))
                check(got, want, "rlinf", plan)
            out[plan.label] = statistics.median(samples)
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
    return out, statistics.median(rtts), zero_copy


# -- Ray -----------------------------------------------------------------------------------
def bench_ray(plans: list[Plan], pings: int) -> tuple[dict[str, float], float]:
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
        out = {}
        for plan in plans:
            want = expected_checksum(make_source(plan.size), plan.messages)
            samples = []
            for trial in range(plan.runs):
                seconds, got = ray.get(producer.run.remote(consumer, plan.size, plan.messages))
                check(got, want, "ray", plan)
                if trial:  # the first run warms up
                    samples.append(mib_per_s(plan.size, plan.messages, seconds))
            out[plan.label] = statistics.median(samples)
        ping = make_source(4 * KiB)
        rtts = []
        for i in range(pings):
            t0 = time.perf_counter()
            ray.get(consumer.echo.remote(ping))
            if i >= pings // 10:
                rtts.append(time.perf_counter() - t0)
        return out, statistics.median(rtts)
    finally:
        ray.shutdown()


# -- report --------------------------------------------------------------------------------
def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="fewer messages and trials")
    parser.add_argument("--pings", type=int, default=400, help="round trips for latency")
    parser.add_argument("--skip-ray", action="store_true", help="leave out the Ray rows")
    args = parser.parse_args()
    os.environ.setdefault("RAY_AUTH_MODE", "disabled")
    os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
    quiet_logs()
    plans = make_plans(args.quick)
    started = time.perf_counter()

    memcpy = bench_memcpy(plans)
    rlinf, rlinf_rtt, zero_copy = bench_rlinf(plans, args.pings)
    mpq = bench_mp_queue(plans)
    if args.skip_ray:
        ray_rows: dict[str, float] = {}
        ray_rtt = float("nan")
    else:
        ray_rows, ray_rtt = bench_ray(plans, args.pings)

    print(f"\nthroughput between two processes, MiB/s (median of {plans[0].trials} trials; "
          f"{os.cpu_count()} cores)")
    header = f"{'payload':>8} {'rlinf':>10} {'ray':>10} {'mp.Queue':>10} {'memcpy':>10}"
    print(header + f" {'rlinf/ray':>10} {'rlinf/memcpy':>13}")
    for plan in plans:
        r, y = rlinf[plan.label], ray_rows.get(plan.label, float("nan"))
        q, m = mpq[plan.label], memcpy[plan.label]
        print(f"{plan.label:>8} {r:10.0f} {y:10.0f} {q:10.0f} {m:10.0f} "
              f"{r / y:10.2f} {r / m:13.2f}")
    print(f"\nround trip of a 4 KiB message, p50: rlinf {rlinf_rtt * 1e6:.0f} us, "
          f"ray actor call {ray_rtt * 1e6:.0f} us")
    print(f"zero-copy receive: {zero_copy}; total time {time.perf_counter() - started:.0f} s")
    summary = {
        "ratio_vs_ray_64MiB": round(rlinf["64MiB"] / ray_rows.get("64MiB", float("nan")), 3),
        "ratio_vs_memcpy_64MiB": round(rlinf["64MiB"] / memcpy["64MiB"], 3),
        "latency_ratio_vs_ray_4KiB": round(rlinf_rtt / ray_rtt, 3),
        "zero_copy_receive": zero_copy,
    }
    sys.stdout.flush()
    print(json.dumps(summary))


if __name__ == "__main__":
    main()
