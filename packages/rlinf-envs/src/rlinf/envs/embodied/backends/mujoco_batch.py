"""`MujocoVectorEnv`: gymnasium's MuJoCo tasks stepped as one batch, the physics outside the GIL.

gymnasium's `env.step` costs about twice the physics it runs: wrapper layers, per-env numpy
calls for observation and reward, and dict building. This backend keeps gymnasium's envs
for what they do once per episode (model loading, seeded resets, rendering, spaces) and
replaces the per-step path:

- **physics**: for each env, the action into ``data.ctrl`` and one ``mj_step(nstep=frame_skip)``
  call (plus `mj_rnePostConstraint` where the task reads contact forces), exactly gymnasium's
  `do_simulation`. `mj_step` releases the GIL, so with ``threads > 1`` the envs are stepped
  in contiguous chunks on a thread pool and the physics runs on that many cores at once;
- **observation, reward, termination**: computed for the whole batch by
  `rlinf.envs.embodied.backends.mujoco_tasks`, proven equal to gymnasium's step by tests;
- **time limit**: the episode length kept by the vector env's bookkeeping, truncating where
  gymnasium's `TimeLimit` would.

`close` may come from another thread than the one stepping (a worker's shutdown): it waits
for steps and resets in flight to return before it frees the simulators and the pool, and
later calls raise `EnvStepError`, instead of racing MuJoCo's data being freed under a step.

Everything else (auto-reset, seeding, episode stats, sub-group views, rendering) is
`LoopVectorEnv`'s, so the two backends produce the same trajectories for the same seed and
actions, and `rlinf.workers.env.state` checkpoints both alike.
"""

from __future__ import annotations

import importlib
import threading
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import numpy.typing as npt

from rlinf.envs.embodied.backends.gym_backend import entry_point
from rlinf.envs.embodied.backends.mujoco_tasks import TASKS, BatchTask
from rlinf.envs.embodied.base import StepResult
from rlinf.envs.embodied.loop import LoopVectorEnv, SingleEnv, _alloc
from rlinf.envs.errors import ConfigError, EnvStepError


def _time_limit(env: Any) -> int | None:
    """The step limit of `env`'s TimeLimit wrapper (None without one). Read from the wrapper,
    not `env.spec`, which is None when the spec cannot be deep-copied."""
    try:
        limit = env.get_wrapper_attr("_max_episode_steps")
    except AttributeError:
        return None
    return int(limit) if limit is not None and limit > 0 else None


def supports(name: str) -> bool:
    """Whether `name` is a gymnasium MuJoCo task this backend has batched arithmetic for."""
    return entry_point(name) in TASKS


@dataclass
class _Physics:
    """What the vector env and its views share beyond `LoopVectorEnv`'s bookkeeping."""

    task: BatchTask
    sims: list[Any]
    """The unwrapped gymnasium envs (their ``model``, ``data`` and ``frame_skip``)."""
    max_episode_steps: int | None
    threads: int
    mj_step: Callable[..., None]
    mj_rne_post_constraint: Callable[..., None]
    pool: ThreadPoolExecutor | None = None
    gate: threading.Condition = field(default_factory=threading.Condition)
    """Guards `in_flight` and `closing`: steps of several views run at once, close waits."""
    in_flight: int = 0
    closing: bool = False


class MujocoVectorEnv(LoopVectorEnv):
    """Vector env of gymnasium MuJoCo `envs` with a batched step (module docstring)."""

    def __init__(self, envs: Sequence[SingleEnv], *, name: str, seed: int = 0,
                 threads: int = 1, max_episode_steps: int | None = None) -> None:
        task_type = TASKS.get(entry_point(name))
        if task_type is None:
            raise ConfigError(
                f"the batched MuJoCo backend has no step arithmetic for {name!r}; it has "
                f"{', '.join(sorted(t.split(':')[1] for t in TASKS))}. Use backend='gymnasium'")
        if threads < 1:
            raise ConfigError(f"threads must be >= 1, got {threads}")
        super().__init__(envs, seed=seed, name=name)
        sims = [env.unwrapped for env in envs]  # type: ignore[attr-defined]
        limit = max_episode_steps or _time_limit(envs[0])
        threads = min(threads, len(envs))
        # Imported here, not at module import: building the envs chose MUJOCO_GL first.
        mujoco = importlib.import_module("mujoco")
        self._physics = _Physics(
            task=task_type(sims[0]), sims=sims, max_episode_steps=limit, threads=threads,
            mj_step=mujoco.mj_step, mj_rne_post_constraint=mujoco.mj_rnePostConstraint,
            pool=ThreadPoolExecutor(threads - 1, thread_name_prefix="rlinf-mujoco")
            if threads > 1 else None,
        )

    @classmethod
    def _view(cls, parent: LoopVectorEnv, indices: npt.NDArray[np.int_]) -> LoopVectorEnv:
        view = super()._view(parent, indices)
        assert isinstance(parent, MujocoVectorEnv) and isinstance(view, MujocoVectorEnv)
        view._physics = parent._physics
        return view

    def __repr__(self) -> str:
        return super().__repr__().replace("LoopVectorEnv", "MujocoVectorEnv", 1)

    @property
    def threads(self) -> int:
        """Threads stepping the physics (1: in the calling thread)."""
        return self._physics.threads

    def _simulate(self, indices: npt.NDArray[np.int_], actions: npt.NDArray[Any]) -> None:
        physics = self._physics
        sims, contact, mj_step = physics.sims, physics.task.contact_forces, physics.mj_step
        for index, action in zip(indices, actions, strict=True):
            sim = sims[index]
            sim.data.ctrl[:] = action
            mj_step(sim.model, sim.data, nstep=sim.frame_skip)  # releases the GIL
            if contact:
                physics.mj_rne_post_constraint(sim.model, sim.data)

    def _simulate_all(self, actions: npt.NDArray[Any]) -> None:
        pool = self._physics.pool
        if pool is None or self.num_envs < 2:
            self._simulate(self._indices, actions)
            return
        parts = min(self._physics.threads, self.num_envs)
        chunks = np.array_split(np.arange(self.num_envs), parts)
        # The calling thread steps the first chunk itself: one hand-off fewer per step.
        futures = [pool.submit(self._simulate, self._indices[c], actions[c])
                   for c in chunks[1:]]
        self._simulate(self._indices[chunks[0]], actions[chunks[0]])
        for future in futures:
            future.result()

    @contextmanager
    def _in_flight(self) -> Iterator[None]:
        """Count a step or reset as running, refused once `close` began."""
        physics = self._physics
        with physics.gate:
            if physics.closing:
                raise EnvStepError(f"{self!r} is closed")
            physics.in_flight += 1
        try:
            yield
        finally:
            with physics.gate:
                physics.in_flight -= 1
                physics.gate.notify_all()

    def reset(self, *, seed: int | None = None) -> tuple[Any, dict[str, Any]]:
        with self._in_flight():
            return super().reset(seed=seed)

    def step(self, actions: npt.ArrayLike) -> StepResult:
        with self._in_flight():
            return self._step(actions)

    def _step(self, actions: npt.ArrayLike) -> StepResult:
        self._check_open()
        shared, physics = self._shared, self._physics
        if not shared.was_reset[self._indices].all():
            raise EnvStepError(f"call reset() on {self!r} before step()")
        batch = self._actions(actions)
        datas = [physics.sims[i].data for i in self._indices]
        before = physics.task.before(datas)
        self._simulate_all(batch)
        space = self.single_observation_space
        obs = _alloc(space, self.num_envs)
        assert isinstance(obs, np.ndarray)
        reward, terminated = physics.task.after(datas, batch, before, obs)
        reward = np.asarray(reward, dtype=np.float64)
        shared.returns[self._indices] += reward
        shared.lengths[self._indices] += 1
        limit = physics.max_episode_steps
        truncated = (shared.lengths[self._indices] >= limit if limit is not None
                     else np.zeros(self.num_envs, dtype=bool))
        done = terminated | truncated
        final_obs = np.zeros_like(obs)
        for local in np.flatnonzero(done):
            index = int(self._indices[local])
            final_obs[local] = obs[local]
            self._finish(index, terminated=bool(terminated[local]))
            obs[local], _ = shared.envs[index].reset(seed=None)
        self._steps += self.num_envs
        return StepResult(obs, reward, terminated, truncated,
                          {"final_mask": done, "final_obs": final_obs})

    def close(self) -> None:
        physics = self._physics
        with physics.gate:
            physics.closing = True
            physics.gate.wait_for(lambda: physics.in_flight == 0)
        if physics.pool is not None:
            physics.pool.shutdown(wait=True)
            physics.pool = None
        super().close()
