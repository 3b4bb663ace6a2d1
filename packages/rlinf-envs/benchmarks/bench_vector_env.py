"""Env steps/s of the vector envs a user could pick for a gymnasium MuJoCo task.

Contenders, interleaved in rounds (A B C ... A B C ...), each timed over `--steps` batched
steps of `--num-envs` envs with the same seeded random actions:

- ``gymnasium SyncVectorEnv``: gymnasium's own vector env (same-step auto-reset, like ours);
- ``rlinf loop``: `LoopVectorEnv` over gymnasium's `step` (``backend="gymnasium"``);
- ``rlinf batched, N thr``: `MujocoVectorEnv` (``backend="mujoco"``), the physics on N threads;
- ``envpool, N thr``: envpool's synchronous vector env on N threads, when envpool is
  installed (``pip install envpool``), the C++ engine the field uses for this.

Every contender gets the same cores (the process's affinity); thread counts go up to
`--threads`. Reported per contender: the median env steps/s over the rounds and the median
CPU-microseconds per env step (all threads of the process), then the ratios to the fastest
gymnasium path. The last line is one JSON object. A run is refused when the 1-minute load
average is above `--max-load` (other work would be timed too).

Usage: python packages/rlinf-envs/benchmarks/bench_vector_env.py [--env HalfCheetah-v5]
       [--num-envs 16] [--steps 500] [--rounds 5] [--threads 2] [--max-load 1.0]
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import statistics
import sys
import time
from collections.abc import Callable
from typing import Any

import gymnasium as gym
import numpy as np

from rlinf.envs.embodied import make_vector_env

Stepper = tuple[Callable[[np.ndarray], Any], Callable[[], None]]  # (step, close)


def _gymnasium_sync(env_id: str, num_envs: int, threads: int) -> Stepper:
    env = gym.vector.SyncVectorEnv(
        [lambda: gym.make(env_id, disable_env_checker=True) for _ in range(num_envs)],
        autoreset_mode=gym.vector.AutoresetMode.SAME_STEP,
    )
    env.reset(seed=0)
    return env.step, env.close


def _rlinf(backend: str) -> Callable[[str, int, int], Stepper]:
    def build(env_id: str, num_envs: int, threads: int) -> Stepper:
        env = make_vector_env(env_id, num_envs=num_envs, seed=0, backend=backend,  # type: ignore[arg-type]
                              threads=threads)
        env.reset()
        return env.step, env.close
    return build


def _envpool(env_id: str, num_envs: int, threads: int) -> Stepper:
    import envpool

    env = envpool.make_gymnasium(env_id, num_envs=num_envs, batch_size=num_envs,
                                 num_threads=threads, seed=0)
    env.reset()
    return env.step, env.close


def contenders(threads: int) -> dict[str, tuple[Callable[[str, int, int], Stepper], int]]:
    """Label -> (builder, threads), in the order they run within a round."""
    counts = sorted({1, threads})
    table: dict[str, tuple[Callable[[str, int, int], Stepper], int]] = {
        "gymnasium SyncVectorEnv": (_gymnasium_sync, 1),
        "rlinf loop": (_rlinf("gymnasium"), 1),
    }
    for count in counts:
        table[f"rlinf batched, {count} thr"] = (_rlinf("mujoco"), count)
    if importlib.util.find_spec("envpool") is not None:
        for count in counts:
            table[f"envpool, {count} thr"] = (_envpool, count)
    return table


def time_one(build: Callable[[str, int, int], Stepper], env_id: str, num_envs: int,
             threads: int, actions: list[np.ndarray]) -> tuple[float, float]:
    """(env steps/s, CPU-microseconds per env step) over `actions` after a short warm-up."""
    step, close = build(env_id, num_envs, threads)
    try:
        for batch in actions[:20]:
            step(batch)
        cpu, wall = time.process_time(), time.perf_counter()
        for batch in actions:
            step(batch)
        wall, cpu = time.perf_counter() - wall, time.process_time() - cpu
    finally:
        close()
    samples = len(actions) * num_envs
    return samples / wall, cpu / samples * 1e6


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--env", default="HalfCheetah-v5")
    parser.add_argument("--num-envs", type=int, default=16)
    parser.add_argument("--steps", type=int, default=500)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--threads", type=int, default=len(os.sched_getaffinity(0)),
                        help="most threads a multi-threaded contender gets (default: all cores)")
    parser.add_argument("--max-load", type=float, default=float(len(os.sched_getaffinity(0))) / 2,
                        help="refuse to run above this 1-minute load average")
    args = parser.parse_args(argv)
    load = os.getloadavg()[0]
    if load > args.max_load:
        print(f"refused: load average {load:.2f} > --max-load {args.max_load}; other work "
              "would be timed too", file=sys.stderr)
        return 3
    space = gym.make(args.env).action_space
    assert isinstance(space, gym.spaces.Box)
    rng = np.random.default_rng(0)
    actions = [rng.uniform(space.low, space.high, (args.num_envs, *space.shape))
               .astype(np.float32) for _ in range(args.steps)]
    table = contenders(args.threads)
    rates: dict[str, list[float]] = {label: [] for label in table}
    cpu_us: dict[str, list[float]] = {label: [] for label in table}
    for _ in range(args.rounds):
        for label, (build, threads) in table.items():
            rate, cpu = time_one(build, args.env, args.num_envs, threads, actions)
            rates[label].append(rate)
            cpu_us[label].append(cpu)
    median = {label: statistics.median(values) for label, values in rates.items()}
    baseline = max(median["gymnasium SyncVectorEnv"], median["rlinf loop"])
    print(f"# {args.env}, {args.num_envs} envs, {args.steps} batched steps x {args.rounds} "
          f"interleaved rounds, {len(os.sched_getaffinity(0))} cores; load average "
          f"{load:.2f} before, {os.getloadavg()[0]:.2f} after")
    print(f"{'contender':<26} {'steps/s':>9} {'cpu us/step':>12} {'vs gymnasium':>13}")
    for label in table:
        print(f"{label:<26} {median[label]:>9.0f} {statistics.median(cpu_us[label]):>12.1f} "
              f"{median[label] / baseline:>12.2f}x")
    batched = max((label for label in table if label.startswith("rlinf batched")),
                  key=median.__getitem__)
    pools = [label for label in table if label.startswith("envpool")]
    best_pool = max(pools, key=median.__getitem__) if pools else None
    print(json.dumps({
        "env": args.env, "num_envs": args.num_envs, "steps_per_s": median,
        "cpu_us_per_step": {label: statistics.median(v) for label, v in cpu_us.items()},
        "batched_speedup_vs_gymnasium": median[batched] / baseline,
        "batched_vs_envpool": median[batched] / median[best_pool] if best_pool else None,
        "load_average": [load, os.getloadavg()[0]],
    }))
    return 0


if __name__ == "__main__":
    sys.exit(main())
