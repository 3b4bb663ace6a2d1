"""Camera observations: gymnasium tasks that observe their own rendered frames.

A VLA sees images, not state vectors. `make_pixel_env` builds the task's simulators with
``rgb_array`` rendering at the requested size and wraps each in `PixelObservation`, whose
observation is the frame after every reset and step as ``uint8 (3, H, W)``. The wrapper sits
below the vector env, so an episode's final frame is rendered before its auto-reset and
arrives as ``final_obs`` like any observation (PPO bootstraps truncations from it).
"""

from __future__ import annotations

from typing import Any

import gymnasium as gym
import numpy as np
import numpy.typing as npt

from rlinf.envs.embodied import LoopVectorEnv, SingleEnv, VectorEnv, resolve_backend
from rlinf.envs.embodied.backends import gym_backend
from rlinf.workers.env.config import EnvWorkerConfig
from rlinf.workers.env.same_start import block_seeded
from rlinf.workers.errors import ConfigError

__all__ = ["PixelObservation", "make_pixel_env"]


class PixelObservation:
    """A `SingleEnv` whose observations are its rendered frames, channels first."""

    def __init__(self, env: SingleEnv, *, size: tuple[int, int]) -> None:
        self._env = env
        self.observation_space: gym.Space[Any] = gym.spaces.Box(
            0, 255, shape=(3, *size), dtype=np.uint8)
        self.action_space: gym.Space[Any] = env.action_space
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


def make_pixel_env(config: EnvWorkerConfig) -> VectorEnv:
    """The vector env of `config` observing ``config.pixels``-sized frames."""
    if config.pixels is None:
        raise ConfigError("make_pixel_env needs EnvWorkerConfig.pixels=(height, width)")
    if resolve_backend(config.env_name) != "gymnasium":
        raise ConfigError(f"pixel observations are implemented for gymnasium tasks, got "
                          f"{config.env_name!r}; ManiSkill3 and LIBERO expose cameras through "
                          "their own observation modes")
    envs: list[SingleEnv] = list(gym_backend.make_envs(
        config.env_name, num_envs=config.num_envs, render_size=config.pixels,
        max_episode_steps=config.max_episode_steps, env_kwargs=dict(config.env_kwargs)))
    if config.same_start_group_size > 1:
        envs = block_seeded(envs, config.same_start_group_size)
    wrapped = [PixelObservation(env, size=config.pixels) for env in envs]
    return LoopVectorEnv(wrapped, seed=config.seed, name=config.env_name)
