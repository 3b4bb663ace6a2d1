"""Stable-Baselines3 PPO on a gymnasium MuJoCo task, as its users run it: bench-embodied's
peer.

``MlpPolicy`` with separate policy and value MLPs of two tanh layers, SB3's PPO defaults
(they equal rlinf's and torchrl's peer's: lr 3e-4, gamma 0.99, GAE 0.95, clip 0.2, value
coefficient 0.5, no entropy bonus, gradient clip 0.5), on one of three vector envs:
``dummy`` (DummyVecEnv, every env in this process), ``subproc`` (SubprocVecEnv, a forked
process per env) or ``envpool`` (envpool's C++ pool on every core, `envpool_vec_env`), with
`threads` torch intra-op threads.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Literal

import numpy as np
import torch

VecKind = Literal["dummy", "subproc", "envpool"]


@dataclass(frozen=True)
class Sb3Setting:
    """What the SB3 peer trains: the same knobs as every bench-embodied contender."""

    env: str
    num_envs: int
    rollout_steps: int
    epochs: int
    minibatches: int
    width: int
    device: str = "cpu"
    seed: int = 0


def make_ppo(s: Sb3Setting, vec: VecKind, *, threads: int) -> Any:
    """An SB3 PPO on `s` over the `vec` vector env (close it with ``model.env.close()``)."""
    import gymnasium as gym
    from stable_baselines3 import PPO
    from stable_baselines3.common.logger import Logger
    from stable_baselines3.common.vec_env import DummyVecEnv, SubprocVecEnv

    makers = [lambda: gym.make(s.env) for _ in range(s.num_envs)]
    if vec == "envpool":
        from envpool_vec_env import EnvpoolVecEnv

        env: Any = EnvpoolVecEnv(s.env, num_envs=s.num_envs, seed=s.seed,
                                 num_threads=len(os.sched_getaffinity(0)))
    elif vec == "dummy":
        env = DummyVecEnv(makers)
    else:
        env = SubprocVecEnv(makers, start_method="fork")
    torch.set_num_threads(threads)
    try:
        model = PPO("MlpPolicy", env, n_steps=s.rollout_steps,
                    batch_size=s.num_envs * s.rollout_steps // s.minibatches,
                    n_epochs=s.epochs, seed=s.seed, device=s.device, verbose=0,
                    policy_kwargs={"net_arch": {"pi": [s.width] * 2, "vf": [s.width] * 2}})
    except BaseException:
        env.close()
        raise
    # A logger with no outputs: SB3's default makes a /tmp/SB3-<time> folder per run.
    model.set_logger(Logger(folder=None, output_formats=[]))
    return model


def _callback(on_rollout_start: Callable[[], None], on_step: Callable[[Any], bool],
              on_rollout_end: Callable[[Any], None]) -> Any:
    from stable_baselines3.common.callbacks import BaseCallback

    class Hooks(BaseCallback):  # type: ignore[misc]
        def _on_rollout_start(self) -> None:
            on_rollout_start()

        def _on_step(self) -> bool:
            return on_step(self.locals)

        def _on_rollout_end(self) -> None:
            on_rollout_end(self.locals)

    return Hooks()


def run_sb3(s: Sb3Setting, vec: VecKind, *, warmup: int, iterations: int, threads: int,
            busy_seconds: Callable[[], float]) -> tuple[list[float], float]:
    """Seconds of each timed PPO iteration (collect n_steps from every env + update) and the
    machine's CPU-seconds over them (from the first timed rollout's start to the end of
    learning: no setup, warm-up or teardown)."""
    starts: list[float] = []
    busy: list[float] = []

    def mark() -> None:
        starts.append(time.perf_counter())
        busy.append(busy_seconds())

    model = make_ppo(s, vec, threads=threads)
    try:
        total = warmup + iterations
        model.learn(total_timesteps=s.num_envs * s.rollout_steps * total,
                    callback=_callback(mark, lambda _: True, lambda _: None))
        mark()  # learn() returns right after the last update: this closes the last iteration
    finally:
        model.env.close()
    gaps = np.diff(starts)
    return ([float(g) for g in gaps[warmup:warmup + iterations]],
            busy[warmup + iterations] - busy[warmup])


def train_until(s: Sb3Setting, vec: VecKind, *, threshold: float, budget_s: float,
                threads: int) -> float:
    """Wall seconds (setup excluded) until the end of the first iteration (rollout + update)
    whose rollout's ended episodes have a mean return of at least `threshold`; ``inf`` when
    `budget_s` runs out first."""
    returns = np.zeros(s.num_envs)
    ended: list[float] = []
    state: dict[str, float] = {}

    def rollout_start() -> None:
        state.setdefault("start", time.perf_counter())
        if "reached" in state:  # the update after the rollout that reached it is done
            state["seconds"] = time.perf_counter() - state["start"]

    def step(local: dict[str, Any]) -> bool:
        if "seconds" in state or time.perf_counter() - state["start"] > budget_s:
            return False
        returns[:] += local["rewards"]
        for i in np.flatnonzero(local["dones"]):
            ended.append(float(returns[i]))
            returns[i] = 0.0
        return True

    def rollout_end(_: dict[str, Any]) -> None:
        if ended and float(np.mean(ended)) >= threshold:
            state["reached"] = 1.0
        ended.clear()

    model = make_ppo(s, vec, threads=threads)
    try:
        # learn() ends at the budget (the callback's False) or after more steps than it has.
        model.learn(total_timesteps=10**9, callback=_callback(rollout_start, step, rollout_end))
        if "reached" in state and "seconds" not in state:  # learn ended right after it
            state["seconds"] = time.perf_counter() - state["start"]
    finally:
        model.env.close()
    return state.get("seconds", float("inf"))
