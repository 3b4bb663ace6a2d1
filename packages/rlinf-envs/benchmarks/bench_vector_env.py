"""Env steps/s of the vector-env implementations a user could pick, on one CPU core.

Compares, for a gymnasium MuJoCo task: a single env in a Python loop (the ceiling per
core), gymnasium's SyncVectorEnv (same-step auto-reset, like ours), and rlinf's
LoopVectorEnv, whole and split into two pipeline groups. Zero actions, so all runs do the
same physics; each figure is the best of `--repeats` timed runs.

Usage: python packages/rlinf-envs/benchmarks/bench_vector_env.py [--env HalfCheetah-v5]
       [--num-envs 8] [--steps 2000] [--repeats 3]
"""

from __future__ import annotations

import argparse
import time
from collections.abc import Callable

import gymnasium as gym
import numpy as np

from rlinf.envs.embodied import make_vector_env


def _best(run: Callable[[], float], repeats: int) -> float:
    return max(run() for _ in range(repeats))


def single(env_id: str, num_envs: int, steps: int) -> float:
    env = gym.make(env_id, disable_env_checker=True)
    env.reset(seed=0)
    action = np.zeros(env.action_space.shape, dtype=np.float32)  # type: ignore[arg-type]
    total = steps * num_envs
    start = time.perf_counter()
    for _ in range(total):
        _, _, terminated, truncated, _ = env.step(action)
        if terminated or truncated:
            env.reset()
    return total / (time.perf_counter() - start)


def sync_vector(env_id: str, num_envs: int, steps: int) -> float:
    env = gym.vector.SyncVectorEnv(
        [lambda: gym.make(env_id, disable_env_checker=True) for _ in range(num_envs)],
        autoreset_mode=gym.vector.AutoresetMode.SAME_STEP,
    )
    env.reset(seed=0)
    actions = np.zeros(env.action_space.shape, dtype=np.float32)  # type: ignore[arg-type]
    start = time.perf_counter()
    for _ in range(steps):
        env.step(actions)
    rate = steps * num_envs / (time.perf_counter() - start)
    env.close()
    return rate


def rlinf_loop(env_id: str, num_envs: int, steps: int, groups: int = 1) -> float:
    env = make_vector_env(env_id, num_envs=num_envs, seed=0)
    env.reset()
    views = env.split(groups)
    actions = [np.zeros(v.action_space.shape, dtype=np.float32)  # type: ignore[arg-type]
               for v in views]
    start = time.perf_counter()
    for _ in range(steps):
        for view, batch in zip(views, actions, strict=True):
            view.step(batch)
    rate = steps * num_envs / (time.perf_counter() - start)
    env.close()
    return rate


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--env", default="HalfCheetah-v5")
    parser.add_argument("--num-envs", type=int, default=8)
    parser.add_argument("--steps", type=int, default=2000)
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    n, steps, repeats = args.num_envs, args.steps, args.repeats
    rows = [
        ("single env, python loop", _best(lambda: single(args.env, n, steps), repeats)),
        ("gymnasium SyncVectorEnv", _best(lambda: sync_vector(args.env, n, steps), repeats)),
        ("rlinf LoopVectorEnv", _best(lambda: rlinf_loop(args.env, n, steps), repeats)),
        ("rlinf LoopVectorEnv, 2 groups",
         _best(lambda: rlinf_loop(args.env, n, steps, groups=2), repeats)),
    ]
    print(f"{args.env}, {n} envs, {steps} batched steps, best of {repeats}")
    for label, rate in rows:
        print(f"{label:32s} {rate:10.0f} env steps/s")


if __name__ == "__main__":
    main()
