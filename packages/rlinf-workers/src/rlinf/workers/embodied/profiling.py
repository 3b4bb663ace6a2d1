"""Brief per-component profiles of an embodied run, for the planner (`rlinf.sched.plan`).

`measure_components` times, on fresh copies (the run's own simulators, sampling streams and
optimizer are untouched):

- ``env``: the env worker's share of one protocol step of a stage group of each batch size
  (simulator step, trajectory bookkeeping, messages), from short rollouts against a policy
  stand-in that answers instantly with fixed actions;
- ``rollout``: one `infer` of a micro-batch of each size (real observations of the task);
- ``actor``: one PPO/GRPO update of ``size × rollout_steps`` samples on each thread count
  in `actor_devices` (a CPU device is a core slot, one torch thread each), plus publishing
  the weights (serialise, deserialise, load into a rollout policy) as the weight sync does.

Each point is the median of `repeats` timed calls after a warm-up (env and actor points at
least `MIN_REPEATS`). The actor's updates on the different thread counts are interleaved
(1, 2, 1, 2, ...), so a slow spell of the shared machine hits every count alike (one call
per point let a single spell set a whole cost curve).
`rlinf.sched.fit_profile` turns the `Profile` into cost curves.
"""

from __future__ import annotations

import pickle
import statistics
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from functools import partial

import numpy as np
import torch

from rlinf.comm import Batch
from rlinf.sched import Measurement, Profile
from rlinf.workers.embodied.actor import EmbodiedActorConfig, EmbodiedActorWorker
from rlinf.workers.embodied.roles.policy_role import RolloutPolicy, build_rollout_policy
from rlinf.workers.embodied.rollout import PolicyRolloutConfig
from rlinf.workers.embodied.vla_policy import VLARolloutConfig
from rlinf.workers.env.config import EnvWorkerConfig
from rlinf.workers.env.trajectory import Trajectory
from rlinf.workers.env.worker import EnvWorker
from rlinf.workers.errors import ConfigError
from rlinf.workers.runtime.context import WorkerContext
from rlinf.workers.runtime.threads import set_cpu_threads

__all__ = ["MIN_REPEATS", "PROFILE_CONTEXT", "EnvProbe", "env_step_seconds", "measure_components",
           "median_seconds", "point", "synthetic_trajectory"]

PROFILE_CONTEXT = WorkerContext(role="profile", rank=0, world_size=1)
"""The context of the throw-away workers a profile times."""
MIN_REPEATS = 3
"""Fewest timed calls behind an env or actor point (their median is the point): one call
per point let a single fast or slow spell of the shared machine set a cost curve."""


def median_seconds(call: Callable[[], object], repeats: int) -> float:
    """Median wall time of `repeats` calls of `call` after one untimed warm-up call."""
    call()  # warm-up: first-call allocations, lazy initialisation
    times = []
    for _ in range(repeats):
        started = time.perf_counter()
        call()
        times.append(time.perf_counter() - started)
    return statistics.median(times)


def point(component: str, batch: int, devices: int, seconds: float) -> Measurement:
    """A timing-only profile point (no memory recorded)."""
    return Measurement(component, batch, devices, seconds, 0, memory_source="none",
                       timestamp=time.time())


def synthetic_trajectory(obs: np.ndarray, action_shape: tuple[int, ...], *, steps: int,
                         seed: int = 0) -> Trajectory:
    """A `steps`-long trajectory of ``len(obs)`` envs repeating `obs` with random actions and
    rewards (for timing updates; shapes and dtypes as a real rollout's)."""
    rng = np.random.default_rng(seed)
    n = len(obs)
    shape = (steps, n)
    return Trajectory(
        obs=np.broadcast_to(obs, (steps, *obs.shape)).copy(),
        actions=rng.uniform(-1, 1, size=(*shape, *action_shape)).astype(np.float32),
        log_probs=rng.normal(-1, 0.1, size=shape).astype(np.float32),
        values=np.zeros(shape, np.float32), next_values=np.zeros(shape, np.float32),
        rewards=rng.normal(size=shape).astype(np.float32),
        terminated=np.zeros(shape, bool), truncated=np.zeros(shape, bool),
        env_indices=np.arange(n, dtype=np.int64))


class _InstantPolicy:
    """Sink and source answering every observation batch at once with fixed actions."""

    def __init__(self, actions: np.ndarray) -> None:
        self._actions = actions
        self._replies: dict[str | None, list[Batch]] = {}

    def put(self, item: Batch, *, key: str | None = None) -> None:
        count = len(item.tensors["env_index"])
        zeros = np.zeros(count, np.float32)
        self._replies.setdefault(key, []).append(Batch({
            "action": self._actions[:count], "log_prob": zeros, "value": zeros,
            "final_value": zeros}))

    def get(self, *, key: str | None = None, timeout: float | None = None) -> Batch:
        return self._replies[key].pop(0)


@dataclass(frozen=True)
class EnvProbe:
    """A throw-away env worker of `size` envs reset from `seed`, a fixed batch of random
    actions for timing its steps, and the observation batch for timing policy `infer`."""

    worker: EnvWorker
    obs: np.ndarray
    actions: np.ndarray
    batch: Batch

    @property
    def action_shape(self) -> tuple[int, ...]:
        return tuple(self.worker.action_space.shape or ())

    @classmethod
    def build(cls, env: EnvWorkerConfig, size: int, *, seed: int) -> EnvProbe:
        """One stage group of `size` envs of `env` (at most one process per env); shut its
        worker down when done."""
        worker = EnvWorker(PROFILE_CONTEXT, config=replace(
            env, num_envs=size, pipeline_stages=1, seed=seed,
            processes=min(env.processes, size)))
        obs = np.asarray(worker.groups[0].reset(seed=seed)[0])
        space = worker.action_space
        space.seed(seed)
        actions = np.stack([space.sample() for _ in range(size)])
        batch = Batch({"obs": obs, "final_obs": obs, "final_mask": np.zeros(size, bool),
                       "env_index": np.arange(size)}, meta={"bootstrap": False})
        return cls(worker, obs, actions, batch)


def env_step_seconds(worker: EnvWorker, actions: np.ndarray, *, repeats: int) -> float:
    """Seconds per stage-group step of the env worker's side of the protocol."""
    steps = 8
    link = _InstantPolicy(actions)
    return median_seconds(
        lambda: worker.rollout(num_steps=steps, sink=link, source=link), repeats) / steps


def _train_and_publish(trainer: EmbodiedActorWorker, policy: RolloutPolicy,
                       traj: Trajectory) -> None:
    trainer.train(traj)
    policy.set_weights(pickle.loads(pickle.dumps(trainer.get_weights())))


def _actor_points(actor: EmbodiedActorConfig, policy: RolloutPolicy, traj: Trajectory, *,
                  samples: int, actor_devices: Sequence[int], repeats: int
                  ) -> list[Measurement]:
    """One ``actor`` point per thread count: the median of `repeats` updates (and weight
    publications), the thread counts taking turns after one warm-up update each."""
    trainers = {}
    for devices in actor_devices:
        set_cpu_threads(devices)
        trainers[devices] = EmbodiedActorWorker(PROFILE_CONTEXT, config=replace(
            actor, num_threads=devices))
        _train_and_publish(trainers[devices], policy, traj)  # warm-up
    times: dict[int, list[float]] = {devices: [] for devices in actor_devices}
    try:
        for _ in range(repeats):
            for devices, trainer in trainers.items():
                set_cpu_threads(devices, rescan=False)
                started = time.perf_counter()
                _train_and_publish(trainer, policy, traj)
                times[devices].append(time.perf_counter() - started)
    finally:
        set_cpu_threads(1, rescan=False)
    return [point("actor", samples, devices, statistics.median(seconds))
            for devices, seconds in times.items()]


def measure_components(*, env: EnvWorkerConfig, rollout: PolicyRolloutConfig | VLARolloutConfig,
                       actor: EmbodiedActorConfig, rollout_steps: int,
                       batch_sizes: Sequence[int], repeats: int = 5,
                       actor_devices: Sequence[int] = (1, 2)) -> Profile:
    """Profile of ``env``, ``rollout`` and ``actor`` (module docstring)."""
    sizes = sorted(set(int(b) for b in batch_sizes))
    if not sizes or sizes[0] < 1 or repeats < 1 or rollout_steps < 1:
        raise ConfigError(f"need batch sizes >= 1, repeats >= 1 and rollout_steps >= 1, got "
                          f"{batch_sizes}, {repeats}, {rollout_steps}")
    threads = torch.get_num_threads()
    points: list[Measurement] = []
    try:
        set_cpu_threads(1)
        policy = build_rollout_policy(PROFILE_CONTEXT, replace(rollout, num_threads=1))
        for size in sizes:
            probe = EnvProbe.build(env, size, seed=env.seed)
            try:
                points.append(point("env", size, 1, env_step_seconds(
                    probe.worker, probe.actions, repeats=max(MIN_REPEATS, repeats))))
                points.append(point("rollout", size, 1, median_seconds(
                    partial(policy.infer, probe.batch), repeats)))
                if size * rollout_steps < actor.num_minibatches or (
                        actor.algorithm == "grpo" and size % actor.grpo_group_size):
                    continue  # the actor never trains on so few samples (or envs)
                traj = synthetic_trajectory(probe.obs, probe.action_shape, steps=rollout_steps,
                                            seed=env.seed)
                points += _actor_points(actor, policy, traj, samples=size * rollout_steps,
                                        actor_devices=actor_devices,
                                        repeats=max(MIN_REPEATS, repeats))
            finally:
                probe.worker.shutdown()
    finally:
        set_cpu_threads(threads, rescan=False)
    return Profile(tuple(points), metadata={"env": env.env_name, "rollout_steps": rollout_steps})
