"""Deterministic evaluation of the trained policy, in the driver process: fresh envs, each
env's first episode, actions without sampling noise (and the frames of env 0 on request).
On LIBERO, evaluation episode i starts from the task's stored initial state i (of 50), as
LIBERO's own evaluation does."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, replace
from typing import Any

import numpy as np
import torch

from rlinf.comm import Batch
from rlinf.envs.embodied import EpisodeStats, resolve_backend
from rlinf.workers.embodied.roles import build_rollout_policy
from rlinf.workers.embodied.rollout import PolicyRolloutConfig
from rlinf.workers.embodied.vla_policy import VLARolloutConfig
from rlinf.workers.env import EnvWorker, EnvWorkerConfig
from rlinf.workers.errors import ConfigError
from rlinf.workers.runtime import WorkerContext

__all__ = ["EvalResult", "evaluate"]


@dataclass(frozen=True)
class EvalResult:
    """A deterministic evaluation: each env's first episode."""

    mean_return: float
    """Mean return of the episodes."""
    success_rate: float | None
    """Fraction that succeeded (None when the task defines no success)."""
    episodes: int
    """Episodes evaluated."""
    frames: np.ndarray | None = None
    """``(T, H, W, 3)`` uint8 frames of the first env's episode when recorded."""


def evaluate(env: EnvWorkerConfig, rollout: PolicyRolloutConfig | VLARolloutConfig,
             weights: Mapping[str, torch.Tensor], *, num_episodes: int, seed: int,
             record_video: bool = False, max_steps: int = 1000) -> EvalResult:
    """Mean return of each of `num_episodes` fresh envs' first episode (seeded from `seed`),
    acting with `weights` deterministically; `record_video` keeps env 0's frames."""
    if num_episodes < 1:
        raise ConfigError(f"num_episodes must be >= 1, got {num_episodes}")
    context = WorkerContext(role="eval", rank=0, world_size=1)
    policy = build_rollout_policy(context, replace(rollout, deterministic=True, seed=seed,
                                                   num_threads=None))
    policy.set_weights(weights)
    kwargs = dict(env.env_kwargs)
    if resolve_backend(env.env_name) == "libero":  # episode i from stored initial state i
        kwargs["init_states"] = "sequential"
    worker = EnvWorker(context, config=replace(env, num_envs=num_episodes, seed=seed,
                                               pipeline_stages=num_episodes,
                                               same_start_group_size=1, env_kwargs=kwargs,
                                               processes=min(env.processes, num_episodes)))
    try:
        return _evaluate(worker, policy, max_steps=max_steps, record_video=record_video)
    finally:
        worker.shutdown()


def _evaluate(worker: EnvWorker, policy: Any, *, max_steps: int,
              record_video: bool) -> EvalResult:
    env = worker.env
    groups = worker.groups  # one env per group: env 0 renders alone
    obs = np.asarray(env.reset(seed=worker.config.seed)[0])
    env.pop_finished_episodes()
    count = env.num_envs
    first: dict[int, EpisodeStats] = {}
    frames: list[np.ndarray] = []
    index = np.arange(count)
    no_final = np.zeros(count, dtype=bool)
    for _ in range(max_steps):
        if record_video and 0 not in first:
            frames.append(groups[0].render()[0])
        reply = policy.infer(Batch({"obs": obs, "final_obs": np.zeros_like(obs),
                                    "final_mask": no_final, "env_index": index}))
        result = env.step(_clip(env.single_action_space, reply))
        obs = np.asarray(result.obs)
        for episode in env.pop_finished_episodes():
            first.setdefault(episode.env_index, episode)
        if len(first) == count:
            break
    if len(first) < count:
        raise ConfigError(f"{count - len(first)} of {count} evaluation episodes did not end "
                          f"within {max_steps} steps: raise max_steps or set a time limit")
    episodes = [first[i] for i in range(count)]
    flags = [e.success for e in episodes if e.success is not None]
    return EvalResult(
        mean_return=float(np.mean([e.episode_return for e in episodes])),
        success_rate=float(np.mean(flags)) if flags else None, episodes=count,
        frames=np.stack(frames) if frames else None)


def _clip(space: Any, reply: Batch) -> np.ndarray:
    import gymnasium as gym

    action = np.asarray(reply.tensors["action"])
    if isinstance(space, gym.spaces.Box):  # the Gaussian is unbounded; the simulator is not
        return np.clip(action, space.low, space.high)
    return action
