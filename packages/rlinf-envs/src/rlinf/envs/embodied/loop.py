"""`LoopVectorEnv`: the vector env over single-env instances, stepped in a plain loop.

One implementation serves every CPU backend (gymnasium MuJoCo, ManiSkill3 on its CPU
sim, LIBERO), since each gives one simulator per instance. A plain loop with batched
numpy buffers measured faster than gymnasium's `SyncVectorEnv` on HalfCheetah-v5
(see docs/architecture.md), and owning the loop is what makes sub-group views and
same-step bookkeeping cheap. Subprocess envs lose on fast simulators; for slow ones (LIBERO's
renderer) the envs may be `RemoteEnv` proxies of an `EnvProcessPool`, which the loop steps
in parallel (`rlinf.envs.embodied.processes`).
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

import gymnasium as gym
import numpy as np
import numpy.typing as npt
import structlog

from rlinf.envs.embodied.base import EpisodeStats, Observation, StepResult, VectorEnv
from rlinf.envs.errors import EnvStepError, RenderError

_log = structlog.get_logger(__name__)


class SingleEnv(Protocol):
    """The gymnasium single-env interface a backend adapter provides (numpy in and out)."""

    observation_space: gym.Space[Any]
    action_space: gym.Space[Any]

    def reset(self, *, seed: int | None = None) -> tuple[Any, dict[str, Any]]: ...

    def step(self, action: Any) -> tuple[Any, Any, Any, Any, dict[str, Any]]: ...

    def render(self) -> Any: ...

    def close(self) -> None: ...


def _alloc(space: gym.Space[Any], count: int, *, zeros: bool = False) -> Observation:
    make = np.zeros if zeros else np.empty
    if isinstance(space, gym.spaces.Dict):
        return {key: make((count, *sub.shape), dtype=sub.dtype)  # type: ignore[misc]
                for key, sub in space.spaces.items()}
    if space.shape is None:
        raise EnvStepError(f"observation space {space} has no fixed shape; cannot batch it")
    return make((count, *space.shape), dtype=space.dtype)  # type: ignore[arg-type,no-any-return]


def _write(buffer: Observation, index: int, obs: Any) -> None:
    if isinstance(buffer, dict):
        for key, array in buffer.items():
            array[index] = obs[key]
    else:
        buffer[index] = obs


def _is_remote(env: Any) -> bool:
    """Whether `env` lives in another process (`RemoteEnv`: split step and reset calls)."""
    return hasattr(env, "step_async") and hasattr(env, "reset_async")


def _step_all(envs: Sequence[Any], actions: npt.NDArray[Any], *, remote: bool
              ) -> list[tuple[Any, Any, Any, Any, dict[str, Any]]]:
    """Step each env; `remote` envs all start before any is awaited, so they step in
    parallel."""
    if remote:
        for env, action in zip(envs, actions, strict=True):
            env.step_async(action)
        return [env.step_wait() for env in envs]
    return [env.step(action) for env, action in zip(envs, actions, strict=True)]


def _reset_all(envs: Sequence[Any], seeds: Sequence[int | None], *, remote: bool
               ) -> list[Any]:
    """First observations of each env reset with its seed (in parallel, as `_step_all`)."""
    if remote:
        for env, seed in zip(envs, seeds, strict=True):
            env.reset_async(seed=seed)
        return [env.reset_wait()[0] for env in envs]
    return [env.reset(seed=seed)[0] for env, seed in zip(envs, seeds, strict=True)]


def _success(info: dict[str, Any]) -> bool | None:
    value = info.get("success", info.get("is_success"))
    return None if value is None else bool(value)


@dataclass
class _Shared:
    """State shared by a vector env and its sub-group views."""

    envs: list[SingleEnv]
    seed: int
    render_error: str | None
    returns: npt.NDArray[np.float64]
    lengths: npt.NDArray[np.int64]
    succeeded: list[bool | None]
    was_reset: npt.NDArray[np.bool_]
    finished: list[EpisodeStats] = field(default_factory=list)
    lock: threading.Lock = field(default_factory=threading.Lock)
    closed: bool = False
    on_close: Callable[[], None] | None = None
    remote: bool = False  # every env a `RemoteEnv`: step and reset them all, then await


class LoopVectorEnv(VectorEnv):
    """Vector env over `envs`, one simulator each; see `rlinf.envs.embodied.base`."""

    def __init__(
        self,
        envs: Sequence[SingleEnv],
        *,
        seed: int = 0,
        name: str = "",
        render_error: str | None = None,
        on_close: Callable[[], None] | None = None,
    ) -> None:
        """`on_close` runs once `close` has closed every env (e.g. stopping the processes
        of an `rlinf.envs.embodied.processes.EnvProcessPool` whose proxies `envs` are)."""
        if not envs:
            raise EnvStepError("a vector env needs at least one env, got none")
        count = len(envs)
        self._shared = _Shared(
            envs=list(envs), seed=seed, render_error=render_error,
            returns=np.zeros(count), lengths=np.zeros(count, dtype=np.int64),
            succeeded=[None] * count, was_reset=np.zeros(count, dtype=bool),
            on_close=on_close, remote=all(_is_remote(env) for env in envs),
        )
        self._indices = np.arange(count)
        self._name = name
        self._steps = 0

    @classmethod
    def _view(cls, parent: LoopVectorEnv, indices: npt.NDArray[np.int_]) -> LoopVectorEnv:
        view = cls.__new__(cls)
        view._shared, view._indices, view._name, view._steps = (
            parent._shared, indices, parent._name, 0)
        return view

    def __repr__(self) -> str:
        first, last = int(self._indices[0]), int(self._indices[-1])
        return f"LoopVectorEnv({self._name!r}, envs {first}..{last} of {len(self._shared.envs)})"

    @property
    def num_envs(self) -> int:
        return len(self._indices)

    @property
    def env_indices(self) -> tuple[int, ...]:
        """Global indices of the envs this view steps."""
        return tuple(int(i) for i in self._indices)

    @property
    def single_observation_space(self) -> gym.Space[Any]:
        return self._shared.envs[0].observation_space

    @property
    def single_action_space(self) -> gym.Space[Any]:
        return self._shared.envs[0].action_space

    @property
    def total_steps(self) -> int:
        return self._steps

    def _check_open(self) -> None:
        if self._shared.closed:
            raise EnvStepError(f"{self!r} is closed")

    def reset(self, *, seed: int | None = None) -> tuple[Observation, dict[str, Any]]:
        self._check_open()
        shared = self._shared
        obs = _alloc(self.single_observation_space, self.num_envs)
        seeds: list[int | None] = []
        for index in self._indices:
            if seed is not None:
                seeds.append(seed + int(index))
            elif not shared.was_reset[index]:
                seeds.append(shared.seed + int(index))
            else:
                seeds.append(None)  # continue the env's own generator
        firsts = _reset_all([shared.envs[index] for index in self._indices], seeds,
                            remote=shared.remote)
        for local, index in enumerate(self._indices):
            _write(obs, local, firsts[local])
            shared.was_reset[index] = True
            shared.returns[index], shared.lengths[index] = 0.0, 0
            shared.succeeded[index] = None
        return obs, {}

    def _actions(self, actions: npt.ArrayLike) -> npt.NDArray[Any]:
        array = np.asarray(actions)
        expected = (self.num_envs, *(self.single_action_space.shape or ()))
        if array.shape != expected:
            raise EnvStepError(
                f"expected actions of shape {expected} for {self!r}, got {array.shape}")
        return array

    def step(self, actions: npt.ArrayLike) -> StepResult:
        self._check_open()
        shared = self._shared
        if not shared.was_reset[self._indices].all():
            raise EnvStepError(f"call reset() on {self!r} before step()")
        batch = self._actions(actions)
        count = self.num_envs
        space = self.single_observation_space
        obs = _alloc(space, count)
        final_obs = _alloc(space, count, zeros=True)
        reward = np.empty(count)
        terminated = np.zeros(count, dtype=bool)
        truncated = np.zeros(count, dtype=bool)
        success = np.zeros(count, dtype=bool)
        any_success_key = False
        envs = [shared.envs[index] for index in self._indices]
        results = _step_all(envs, batch, remote=shared.remote)
        for local, index in enumerate(self._indices):
            env = envs[local]
            single_obs, r, term, trunc, info = results[local]
            reward[local], terminated[local], truncated[local] = r, term, trunc
            shared.returns[index] += float(r)
            shared.lengths[index] += 1
            step_success = _success(info)
            if step_success is not None:
                any_success_key = True
                success[local] = step_success
                shared.succeeded[index] = bool(shared.succeeded[index]) or step_success
            if term or trunc:
                _write(final_obs, local, single_obs)
                self._finish(int(index), terminated=bool(term))
                single_obs, _ = env.reset(seed=None)
            _write(obs, local, single_obs)
        self._steps += count
        info_out: dict[str, Any] = {"final_mask": terminated | truncated, "final_obs": final_obs}
        if any_success_key:
            info_out["success"] = success
        return StepResult(obs, reward, terminated, truncated, info_out)

    def _finish(self, index: int, *, terminated: bool) -> None:
        shared = self._shared
        stats = EpisodeStats(
            env_index=index, episode_return=float(shared.returns[index]),
            length=int(shared.lengths[index]), terminated=terminated,
            success=shared.succeeded[index],
        )
        with shared.lock:
            shared.finished.append(stats)
        shared.returns[index], shared.lengths[index] = 0.0, 0
        shared.succeeded[index] = None

    def pop_finished_episodes(self) -> list[EpisodeStats]:
        mine = set(self.env_indices)
        with self._shared.lock:
            popped = [s for s in self._shared.finished if s.env_index in mine]
            self._shared.finished = [s for s in self._shared.finished if s.env_index not in mine]
        return popped

    def render(self) -> npt.NDArray[np.uint8]:
        self._check_open()
        if self._shared.render_error is not None:
            raise RenderError(self._shared.render_error)
        frames = []
        for index in self._indices:
            try:
                frame = self._shared.envs[index].render()
            except Exception as exc:  # GL backends fail with assorted native errors
                raise RenderError(
                    f"offscreen rendering failed for {self!r}: {exc!r}. Headless MuJoCo needs "
                    "MUJOCO_GL=egl (or osmesa with libosmesa6) set before mujoco is imported"
                ) from exc
            if frame is None:
                raise RenderError(f"{self!r} was built without an rgb_array render mode")
            frames.append(np.asarray(frame, dtype=np.uint8))
        return np.stack(frames)

    def get_attr(self, name: str) -> list[Any]:
        values = []
        for index in self._indices:
            env: Any = self._shared.envs[index]
            # gymnasium wrappers stopped forwarding attributes; get_wrapper_attr looks inside.
            getter = getattr(env, "get_wrapper_attr", None)
            try:
                values.append(getter(name) if getter is not None else getattr(env, name))
            except AttributeError as exc:
                raise EnvStepError(
                    f"env {int(index)} of {self!r} has no attribute {name!r}") from exc
        return values

    def split(self, num_groups: int) -> list[VectorEnv]:
        if not 1 <= num_groups <= self.num_envs:
            raise EnvStepError(
                f"num_groups must be between 1 and num_envs={self.num_envs}, got {num_groups}")
        return [type(self)._view(self, part)
                for part in np.array_split(self._indices, num_groups)]

    def close(self) -> None:
        shared = self._shared
        if shared.closed:
            return
        shared.closed = True
        for env in shared.envs:
            try:
                env.close()
            except Exception as exc:  # one broken env must not keep the others open
                _log.warning("env_close_failed", env=self._name, error=repr(exc))
        if shared.on_close is not None:
            shared.on_close()
