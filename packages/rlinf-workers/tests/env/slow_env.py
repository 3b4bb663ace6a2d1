"""A toy env whose resets can take seconds (as LIBERO's do), built in env processes by
`SlowShard` (importable there: the test puts this package's root on PYTHONPATH)."""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any

import gymnasium as gym
import numpy as np


class SlowResetEnv(gym.Env[np.ndarray, np.ndarray]):
    """Observes its step count; ends every `episode` steps; every reset after the first
    sleeps `reset_s` when `slow`."""

    observation_space = gym.spaces.Box(-np.inf, np.inf, (4,), np.float32)
    action_space = gym.spaces.Box(-1.0, 1.0, (1,), np.float32)

    def __init__(self, *, slow: bool, reset_s: float, episode: int) -> None:
        self.slow, self.reset_s, self.episode = slow, reset_s, episode
        self.resets = 0
        self.t = 0

    def _obs(self) -> np.ndarray:
        return np.full(4, self.t, np.float32)

    def reset(self, *, seed: int | None = None, options: Any = None
              ) -> tuple[np.ndarray, dict[str, Any]]:
        super().reset(seed=seed)
        if self.slow and self.resets:
            time.sleep(self.reset_s)
        self.resets += 1
        self.t = 0
        return self._obs(), {}

    def step(self, action: np.ndarray) -> tuple[np.ndarray, float, bool, bool, dict[str, Any]]:
        self.t += 1
        return self._obs(), 1.0, self.t >= self.episode, False, {}


@dataclass(frozen=True)
class SlowShard:
    """A `ShardBuilder`: envs in `slow` reset slowly and end every `episode` steps; the others
    never end."""

    slow: frozenset[int]
    reset_s: float
    episode: int

    def __call__(self, indices: Any) -> list[SlowResetEnv]:
        return [SlowResetEnv(slow=i in self.slow, reset_s=self.reset_s,
                             episode=self.episode if i in self.slow else 10**9)
                for i in indices]
