"""A minimal in-process embodied training loop and a deterministic evaluation.

The loop is the macro flow of embodied RL in one process: rollout (collocated or pipelined)
→ actor.train → weight sync to the rollout worker. Apps run the same steps across workers.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Literal

import numpy as np
import torch

from rlinf.workers.embodied.actor import EmbodiedActorWorker, first_episode_mask
from rlinf.workers.embodied.drivers import run_collocated, run_pipelined
from rlinf.workers.embodied.rollout import PolicyRolloutConfig, PolicyRolloutWorker
from rlinf.workers.env.config import EnvWorkerConfig
from rlinf.workers.env.trajectory import Trajectory
from rlinf.workers.env.worker import EnvRollout, EnvWorker
from rlinf.workers.errors import ConfigError
from rlinf.workers.models.policy import PolicyConfig
from rlinf.workers.runtime.context import WorkerContext

__all__ = ["IterationResult", "evaluate_policy", "rollout_once", "train"]

Schedule = Literal["collocated", "pipelined"]


@dataclass(frozen=True)
class IterationResult:
    """One rollout + update."""

    iteration: int
    """0-based iteration number."""
    steps_per_s: float
    """Env steps per second of the rollout."""
    episode_return: float | None
    """Mean return of the episodes that finished in the rollout (None if none did)."""
    stats: Mapping[str, float]
    """The actor's training statistics."""


def rollout_once(env: EnvWorker, policy: PolicyRolloutWorker, *, num_steps: int,
                 schedule: Schedule) -> EnvRollout:
    """One rollout under `schedule`."""
    if schedule == "collocated":
        return run_collocated(env, policy, num_steps=num_steps)
    if schedule == "pipelined":
        return run_pipelined(env, policy, num_steps=num_steps)
    raise ConfigError(f"schedule must be 'collocated' or 'pipelined', got {schedule!r}")


def train(env: EnvWorker, policy: PolicyRolloutWorker, actor: EmbodiedActorWorker, *,
          iterations: int, num_steps: int, schedule: Schedule = "pipelined",
          reset_seed: int | None = None) -> list[IterationResult]:
    """`iterations` rounds of rollout → train → weight sync.

    With `reset_seed` (GRPO) every rollout starts fresh episodes seeded
    ``reset_seed + iteration * num_envs``, so each rollout's first episodes are its samples.
    """
    policy.set_weights(actor.get_weights())
    results = []
    for it in range(iterations):
        if reset_seed is not None:
            env.reset(seed=reset_seed + it * env.config.num_envs)
        rollout = rollout_once(env, policy, num_steps=num_steps, schedule=schedule)
        stats = actor.train(Trajectory.concat(rollout.trajectories))
        policy.set_weights(actor.get_weights())
        returns = [e.episode_return for e in rollout.episodes]
        results.append(IterationResult(
            iteration=it, steps_per_s=rollout.steps_per_s,
            episode_return=float(np.mean(returns)) if returns else None, stats=stats))
    return results


def evaluate_policy(policy: PolicyConfig, weights: Mapping[str, torch.Tensor] | None, *,
                    env_name: str, num_episodes: int, max_episode_steps: int,
                    seed: int = 10_000, deterministic: bool = True) -> float:
    """Mean return of the first episode of `num_episodes` envs (one rollout, no training).

    `weights=None` evaluates the freshly initialised policy; `deterministic` acts with the
    mode of the action distribution.
    """
    context = WorkerContext(role="eval", rank=0, world_size=1)
    worker = PolicyRolloutWorker(context, config=PolicyRolloutConfig(
        policy=policy, seed=seed, deterministic=deterministic))
    if weights is not None:
        worker.set_weights(weights)
    env = EnvWorker(context, config=EnvWorkerConfig(
        env_name=env_name, num_envs=num_episodes, seed=seed,
        max_episode_steps=max_episode_steps))
    try:
        rollout = run_collocated(env, worker, num_steps=max_episode_steps)
    finally:
        env.shutdown()
    traj = Trajectory.concat(rollout.trajectories)
    mask = first_episode_mask(torch.from_numpy(traj.terminated), torch.from_numpy(traj.truncated))
    return float((torch.from_numpy(traj.rewards) * mask).sum(dim=0).mean())
