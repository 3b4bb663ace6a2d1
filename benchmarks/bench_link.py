"""Env <-> policy link: the round trip of one observation batch out and one action batch back
between two processes of one node, as an env worker and its policy trade them every step.

Contenders, interleaved in rounds (A B C A B C ...), each in a fresh pair of processes:
- ``ring_spinN``: rlinf's `PeerChannel` over its shared-memory ring (the flow's p2p edge
  between processes of one node), a waiting side polling N microseconds before it sleeps
  (``--spin-us``, one contender per value);
- ``endpoint``: the same `PeerChannel` with the ring turned off (framed socket messages);
- ``mp_pipe``: a `multiprocessing.Pipe` with pickled numpy, what a user writes by hand
  (SB3's SubprocVecEnv talks to its workers this way).

Prints per contender the median round trip, the CPU-seconds both processes spent per 1,000
round trips, and the load average; the last line is one JSON object with the medians and
``ring_speedup_vs_endpoint`` / ``ring_speedup_vs_mp_pipe``.
"""

from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import os
import statistics
import time
from collections.abc import Callable
from typing import Any

import numpy as np

from rlinf.comm._internal.ring import SPIN_ENV

EDGE_OUT, EDGE_BACK = "env->policy", "policy->env"


def _cpu_seconds(pid: int) -> float:
    """User + system CPU seconds of process `pid` so far (from /proc)."""
    with open(f"/proc/{pid}/stat") as stat:
        fields = stat.read().rpartition(")")[2].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def _quiet() -> None:
    import logging

    import structlog
    structlog.configure(wrapper_class=structlog.make_filtering_bound_logger(logging.ERROR))


def _peer_policy(address: str, token_hex: str, shared_memory: bool, steps: int,
                 action_dim: int) -> None:
    """The policy side: answer each observation batch with an action batch."""
    _quiet()
    os.environ["RLINF_COMM_TOKEN"] = token_hex
    from rlinf.comm import Batch, Endpoint, TCPStore
    from rlinf.workers.flow.peer import PeerChannel

    store = TCPStore(address, timeout=60)
    me = Endpoint("bench/policy/0", store=store)
    filed = PeerChannel.mailbox()
    source = PeerChannel(me, edge=EDGE_OUT, peer="bench/env/0", timeout=60, filed=filed,
                         shared_memory=shared_memory)
    sink = PeerChannel(me, edge=EDGE_BACK, peer="bench/env/0", timeout=60, filed=filed,
                       shared_memory=shared_memory)
    for _ in range(steps):
        obs = source.get(key="stage0")
        sink.put(Batch({"action": np.zeros((obs["obs"].shape[0], action_dim), np.float32)},
                       meta={"step": obs.meta["step"]}), key="stage0")
    store.get("bench/done", timeout=60)
    source.disconnect()
    sink.disconnect()
    me.close()


def run_peer(shared_memory: bool, steps: int, num_envs: int, obs_dim: int,
             action_dim: int) -> tuple[list[float], float]:
    """Round-trip times over `PeerChannel`, and CPU-seconds of both processes."""
    from rlinf.comm import Batch, Endpoint, TCPStore, new_token, token_env_value
    from rlinf.workers.flow.peer import PeerChannel

    token = new_token()
    os.environ["RLINF_COMM_TOKEN"] = token_env_value(token)
    with TCPStore.serve(token=token, timeout=60) as store:
        me = Endpoint("bench/env/0", store=store)
        ctx = mp.get_context("spawn")
        child = ctx.Process(target=_peer_policy, args=(store.address, token.hex(),
                                                       shared_memory, steps, action_dim))
        child.start()
        filed = PeerChannel.mailbox()
        sink = PeerChannel(me, edge=EDGE_OUT, peer="bench/policy/0", timeout=60, filed=filed,
                           shared_memory=shared_memory)
        source = PeerChannel(me, edge=EDGE_BACK, peer="bench/policy/0", timeout=60,
                             filed=filed, shared_memory=shared_memory)
        obs = np.random.default_rng(0).standard_normal((num_envs, obs_dim)).astype(np.float32)
        times: list[float] = []
        cpu0 = _cpu_seconds(os.getpid())
        child_cpu0 = None
        for step in range(steps):
            t0 = time.perf_counter()
            sink.put(Batch({"obs": obs}, meta={"step": step}), key="stage0")
            source.get(key="stage0")
            times.append(time.perf_counter() - t0)
            if step == steps // 10:  # past warm-up: connections and rings are open
                assert child.pid is not None
                child_cpu0, cpu0, times = _cpu_seconds(child.pid), _cpu_seconds(os.getpid()), []
        assert child.pid is not None and child_cpu0 is not None
        cpu = _cpu_seconds(os.getpid()) - cpu0 + _cpu_seconds(child.pid) - child_cpu0
        store.set("bench/done", b"1")
        child.join(timeout=60)
        sink.disconnect()
        source.disconnect()
        me.close()
    return times, cpu


def _pipe_policy(conn: Any, steps: int, action_dim: int) -> None:
    for _ in range(steps):
        obs = conn.recv()
        conn.send({"action": np.zeros((obs["obs"].shape[0], action_dim), np.float32)})


def run_pipe(steps: int, num_envs: int, obs_dim: int, action_dim: int
             ) -> tuple[list[float], float]:
    ctx = mp.get_context("spawn")
    ours, theirs = ctx.Pipe()
    child = ctx.Process(target=_pipe_policy, args=(theirs, steps, action_dim))
    child.start()
    obs = np.random.default_rng(0).standard_normal((num_envs, obs_dim)).astype(np.float32)
    times: list[float] = []
    cpu0, child_cpu0 = _cpu_seconds(os.getpid()), None
    for step in range(steps):
        t0 = time.perf_counter()
        ours.send({"obs": obs, "step": step})
        ours.recv()
        times.append(time.perf_counter() - t0)
        if step == steps // 10:
            assert child.pid is not None
            child_cpu0, cpu0, times = _cpu_seconds(child.pid), _cpu_seconds(os.getpid()), []
    assert child.pid is not None and child_cpu0 is not None
    cpu = _cpu_seconds(os.getpid()) - cpu0 + _cpu_seconds(child.pid) - child_cpu0
    child.join(timeout=60)
    return times, cpu


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--num-envs", type=int, default=8, help="envs per batch")
    parser.add_argument("--obs-dim", type=int, default=17, help="observation size per env")
    parser.add_argument("--action-dim", type=int, default=6, help="action size per env")
    parser.add_argument("--steps", type=int, default=3000, help="round trips per run")
    parser.add_argument("--rounds", type=int, default=3, help="interleaved rounds")
    parser.add_argument("--spin-us", type=float, nargs="+", default=[0.0, 20.0],
                        help="ring contenders: microseconds a waiting side polls before it "
                             "sleeps (one ring contender per value)")
    args = parser.parse_args()
    _quiet()
    shape = (args.steps, args.num_envs, args.obs_dim, args.action_dim)
    def ring(spin_us: float) -> Callable[[], tuple[list[float], float]]:
        def run() -> tuple[list[float], float]:
            os.environ[SPIN_ENV] = str(spin_us)  # the spawned policy process inherits it
            try:
                return run_peer(True, *shape)
            finally:
                os.environ.pop(SPIN_ENV, None)
        return run

    contenders: dict[str, Callable[[], tuple[list[float], float]]] = {
        f"ring_spin{spin:g}": ring(spin) for spin in args.spin_us}
    contenders["endpoint"] = lambda: run_peer(False, *shape)
    contenders["mp_pipe"] = lambda: run_pipe(*shape)
    medians: dict[str, list[float]] = {name: [] for name in contenders}
    cpu_per_1k: dict[str, list[float]] = {name: [] for name in contenders}
    loads = [os.getloadavg()[0]]
    for _ in range(args.rounds):
        for name, run in contenders.items():
            times, cpu = run()
            medians[name].append(statistics.median(times))
            cpu_per_1k[name].append(cpu / len(times) * 1000)
            loads.append(os.getloadavg()[0])
    result: dict[str, float] = {}
    print(f"round trip of {args.num_envs}x{args.obs_dim} float32 observations and "
          f"{args.num_envs}x{args.action_dim} actions, {args.rounds} interleaved rounds "
          f"of {args.steps} (load average {min(loads):.1f}-{max(loads):.1f})")
    for name in contenders:
        rtt = statistics.median(medians[name])
        cpu = statistics.median(cpu_per_1k[name])
        result[f"{name}_rtt_us"] = round(rtt * 1e6, 1)
        result[f"{name}_cpu_s_per_1k"] = round(cpu, 4)
        print(f"  {name:14s} median {rtt * 1e6:7.1f} us   CPU {cpu:.3f} s per 1k round trips "
              f"(both processes)")
    best = min((name for name in contenders if name.startswith("ring")),
               key=lambda name: result[f"{name}_rtt_us"])
    result["best_ring"] = best  # type: ignore[assignment]
    result["ring_speedup_vs_endpoint"] = round(result["endpoint_rtt_us"]
                                               / result[f"{best}_rtt_us"], 2)
    result["ring_speedup_vs_mp_pipe"] = round(result["mp_pipe_rtt_us"]
                                              / result[f"{best}_rtt_us"], 2)
    result["load_average_max"] = round(max(loads), 2)
    print(json.dumps(result))


if __name__ == "__main__":
    main()
