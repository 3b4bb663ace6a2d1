"""envpool's C++ vector env behind Stable-Baselines3's `VecEnv` API, for bench-embodied's peer.

envpool resets an env on the step after its episode ended; SB3 expects the reset in the
same step, with the episode's last observation in ``infos[i]["terminal_observation"]`` and
``"TimeLimit.truncated"`` set for time-limit ends. `EnvpoolVecEnv.step_wait` resets the
finished envs right away (one batched `reset(env_ids)`), so SB3's PPO sees exactly what it
sees from `DummyVecEnv`. This is how envpool's own SB3 example adapts it.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
from stable_baselines3.common.vec_env.base_vec_env import VecEnv


class EnvpoolVecEnv(VecEnv):  # type: ignore[misc]
    """`num_envs` copies of `env_id` stepped by envpool on `num_threads` threads."""

    def __init__(self, env_id: str, *, num_envs: int, num_threads: int, seed: int = 0) -> None:
        import envpool

        self.pool = envpool.make_gymnasium(env_id, num_envs=num_envs, batch_size=num_envs,
                                           num_threads=num_threads, seed=seed)
        super().__init__(num_envs, self.pool.observation_space, self.pool.action_space)
        self._actions: np.ndarray | None = None

    def reset(self) -> np.ndarray:
        obs, _ = self.pool.reset()
        return np.asarray(obs)

    def step_async(self, actions: np.ndarray) -> None:
        self._actions = actions

    def step_wait(self) -> tuple[np.ndarray, np.ndarray, np.ndarray, list[dict[str, Any]]]:
        assert self._actions is not None, "step_async before step_wait"
        obs, rewards, terminated, truncated, _ = self.pool.step(self._actions)
        obs = np.array(obs)
        dones = np.logical_or(terminated, truncated)
        infos: list[dict[str, Any]] = [{} for _ in range(self.num_envs)]
        finished = np.flatnonzero(dones)
        for index in finished:
            infos[index]["terminal_observation"] = obs[index].copy()
            infos[index]["TimeLimit.truncated"] = bool(truncated[index] and not terminated[index])
        if len(finished):
            obs[finished], _ = self.pool.reset(finished.astype(np.int32))
        return obs, np.asarray(rewards, dtype=np.float32), dones, infos

    def close(self) -> None:
        self.pool.close()

    # SB3 calls these for wrappers and monitors; envpool has no per-env Python objects.
    def get_attr(self, attr_name: str, indices: Any = None) -> list[Any]:
        return [getattr(self.pool, attr_name)] * len(self._indices(indices))

    def set_attr(self, attr_name: str, value: Any, indices: Any = None) -> None:
        raise NotImplementedError("envpool envs have no per-env attributes to set")

    def env_method(self, method_name: str, *args: Any, indices: Any = None,
                   **kwargs: Any) -> list[Any]:
        raise NotImplementedError("envpool envs have no per-env methods")

    def env_is_wrapped(self, wrapper_class: type, indices: Any = None) -> list[bool]:
        return [False] * len(self._indices(indices))

    def _indices(self, indices: Any) -> Sequence[int]:
        if indices is None:
            return range(self.num_envs)
        return [indices] if isinstance(indices, int) else list(indices)
