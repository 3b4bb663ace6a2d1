"""Camera observations: what a VLA or CNN policy sees, as one ``uint8 (C, H, W)`` array.

A VLA sees images, not state vectors. For gymnasium tasks `make_pixel_env` builds the
simulators with ``rgb_array`` rendering at the requested size and wraps each in
`PixelObservation`, whose observation is the frame after every reset and step as
``uint8 (3, H, W)``. LIBERO tasks have two cameras: `CameraStack` stacks the agent-view and
wrist images into ``uint8 (6, H, W)``. The wrappers sit below the vector
env, so an episode's final frame is rendered before its auto-reset and arrives as
``final_obs`` like any observation (PPO bootstraps truncations from it).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import gymnasium as gym
import numpy as np
import numpy.typing as npt

from rlinf.envs.embodied import (
    LoopVectorEnv,
    ShardSpec,
    SingleEnv,
    VectorEnv,
    resolve_backend,
    sharded_vector_env,
)
from rlinf.workers.env.config import EnvWorkerConfig
from rlinf.workers.env.same_start import block_seeded
from rlinf.workers.errors import ConfigError

__all__ = ["CameraStack", "PixelObservation", "PixelShard", "make_pixel_env"]

LIBERO_CAMERAS = ("image", "wrist_image")
"""LIBERO's observation keys stacked by `CameraStack`: agent view, then wrist."""



class PixelObservation:
    """A `SingleEnv` whose observations are its rendered frames, channels first."""

    def __init__(self, env: SingleEnv, *, size: tuple[int, int]) -> None:
        self._env = env
        self.observation_space: gym.Space[Any] = gym.spaces.Box(
            0, 255, shape=(3, *size), dtype=np.uint8)
        self.action_space: gym.Space[Any] = env.action_space
        self.instruction = ""  # gymnasium tasks have none: the env worker falls back to the id
        self._size = size

    def _frame(self) -> npt.NDArray[np.uint8]:
        frame = np.asarray(self._env.render(), dtype=np.uint8)
        if frame.shape != (*self._size, 3):
            raise ConfigError(f"expected rendered frames of shape {(*self._size, 3)}, got "
                              f"{frame.shape}: the task ignores the render size")
        return np.ascontiguousarray(frame.transpose(2, 0, 1))

    def reset(self, *, seed: int | None = None) -> tuple[Any, dict[str, Any]]:
        _, info = self._env.reset(seed=seed)
        return self._frame(), info

    def step(self, action: Any) -> tuple[Any, Any, Any, Any, dict[str, Any]]:
        _, reward, terminated, truncated, info = self._env.step(action)
        return self._frame(), reward, terminated, truncated, info

    def render(self) -> Any:
        return self._env.render()

    def close(self) -> None:
        self._env.close()


def _instruction(env: Any) -> str:
    """The task's language instruction, looked up through wrappers (``_env``); "" if none."""
    while env is not None:
        if isinstance(getattr(env, "instruction", None), str):
            return str(env.instruction)
        env = getattr(env, "_env", None)
    return ""


class CameraStack:
    """A `SingleEnv` with dict camera observations (LIBERO's) seen as one channel stack."""

    def __init__(self, env: SingleEnv, *, size: tuple[int, int],
                 keys: tuple[str, ...] = LIBERO_CAMERAS) -> None:
        self._env = env
        self._keys = keys
        self.observation_space: gym.Space[Any] = gym.spaces.Box(
            0, 255, shape=(3 * len(keys), *size), dtype=np.uint8)
        self.action_space: gym.Space[Any] = env.action_space
        self.instruction: str = _instruction(env)

    def _stack(self, obs: dict[str, Any]) -> npt.NDArray[np.uint8]:
        return np.concatenate([np.asarray(obs[key], dtype=np.uint8).transpose(2, 0, 1)
                               for key in self._keys])

    def reset(self, *, seed: int | None = None) -> tuple[Any, dict[str, Any]]:
        obs, info = self._env.reset(seed=seed)
        return self._stack(obs), info

    def step(self, action: Any) -> tuple[Any, Any, Any, Any, dict[str, Any]]:
        obs, reward, terminated, truncated, info = self._env.step(action)
        return self._stack(obs), reward, terminated, truncated, info

    def render(self) -> Any:
        return self._env.render()

    def close(self) -> None:
        self._env.close()


@dataclass(frozen=True)
class PixelShard:
    """The camera-observing envs of `config` at given global indices (picklable: an env
    process builds its shard with it)."""

    config: EnvWorkerConfig

    def __call__(self, indices: Sequence[int]) -> list[SingleEnv]:
        config = self.config
        if config.pixels is None:
            raise ConfigError("make_pixel_env needs EnvWorkerConfig.pixels=(height, width)")
        backend = resolve_backend(config.env_name)
        envs = ShardSpec(backend, config.env_name, config.pixels, config.max_episode_steps,
                         dict(config.env_kwargs), config.num_envs)(indices)
        if config.same_start_group_size > 1:
            envs = block_seeded(envs, config.same_start_group_size, indices)
        return [CameraStack(env, size=config.pixels) if backend == "libero"
                else PixelObservation(env, size=config.pixels) for env in envs]


def make_pixel_env(config: EnvWorkerConfig) -> VectorEnv:
    """The vector env of `config` observing ``config.pixels``-sized camera images, its envs
    sharded over ``config.processes`` processes when that is more than one."""
    if config.pixels is None:
        raise ConfigError("make_pixel_env needs EnvWorkerConfig.pixels=(height, width)")
    if resolve_backend(config.env_name) not in ("gymnasium", "libero"):
        raise ConfigError(f"pixel observations are implemented for gymnasium and LIBERO tasks, "
                          f"got {config.env_name!r}; ManiSkill3 exposes cameras through its "
                          "own observation modes")
    shard = PixelShard(config)
    if config.processes > 1:
        return sharded_vector_env(shard, num_envs=config.num_envs, processes=config.processes,
                                  seed=config.seed, name=config.env_name,
                                  stage_groups=config.process_stage_groups)
    return LoopVectorEnv(shard(range(config.num_envs)), seed=config.seed, name=config.env_name)
