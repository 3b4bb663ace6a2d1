"""Envs that start each episode from the same state as the rest of their block (for GRPO).

`LoopVectorEnv` seeds env i with ``seed + i``; wrapping env i so that it subtracts its offset
in its block makes all envs of a block receive one seed, hence one initial state. Auto-resets
then continue each env's own generator; envs of a block consume their generators identically
(MuJoCo tasks draw only at reset), so every later episode of a block starts identically too.
Tasks the batched MuJoCo backend knows step as one batch (`MujocoVectorEnv` on `threads`
threads), as in the plain env worker.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import gymnasium as gym

from rlinf.envs.embodied import LoopVectorEnv, SingleEnv, VectorEnv, resolve_backend
from rlinf.envs.embodied.backends import gym_backend, mujoco_batch
from rlinf.workers.env.config import EnvWorkerConfig
from rlinf.workers.errors import ConfigError

__all__ = ["block_seeded", "make_same_start_env"]


class _BlockSeeded:
    """A `SingleEnv` whose seeded resets are shifted back to its block's first seed."""

    def __init__(self, env: SingleEnv, offset: int) -> None:
        self._env = env
        self._offset = offset
        self.observation_space: gym.Space[Any] = env.observation_space
        self.action_space: gym.Space[Any] = env.action_space

    def reset(self, *, seed: int | None = None) -> tuple[Any, dict[str, Any]]:
        return self._env.reset(seed=None if seed is None else seed - self._offset)

    def step(self, action: Any) -> tuple[Any, Any, Any, Any, dict[str, Any]]:
        return self._env.step(action)

    @property
    def unwrapped(self) -> Any:
        """The gymnasium env underneath (the batched MuJoCo backend steps its physics)."""
        return self._env.unwrapped  # type: ignore[attr-defined]

    def get_wrapper_attr(self, name: str) -> Any:
        return self._env.get_wrapper_attr(name)  # type: ignore[attr-defined]

    def render(self) -> Any:
        return self._env.render()

    def close(self) -> None:
        self._env.close()


def make_same_start_env(config: EnvWorkerConfig) -> VectorEnv:
    """A vector env whose blocks of `config.same_start_group_size` envs share start states."""
    if resolve_backend(config.env_name) != "gymnasium":
        raise ConfigError(f"same_start_group_size > 1 supports gymnasium tasks only, got "
                          f"{config.env_name!r}")
    envs = gym_backend.make_envs(
        config.env_name, num_envs=config.num_envs, render_size=(128, 128),
        max_episode_steps=config.max_episode_steps, env_kwargs=dict(config.env_kwargs),
    )
    wrapped = block_seeded(envs, config.same_start_group_size)
    if mujoco_batch.supports(config.env_name):  # batched physics: resets stay per env
        return mujoco_batch.MujocoVectorEnv(wrapped, name=config.env_name, seed=config.seed,
                                            threads=config.threads,
                                            max_episode_steps=config.max_episode_steps)
    return LoopVectorEnv(wrapped, seed=config.seed, name=config.env_name)


def block_seeded(envs: list[SingleEnv], size: int,
                 indices: Sequence[int] | None = None) -> list[SingleEnv]:
    """`envs` wrapped so that each consecutive block of `size` shares one reset seed;
    `indices` are the envs' global indices (default 0, 1, ...: a process's shard has others)."""
    order = range(len(envs)) if indices is None else indices
    return [_BlockSeeded(env, i % size) for i, env in zip(order, envs, strict=True)]
