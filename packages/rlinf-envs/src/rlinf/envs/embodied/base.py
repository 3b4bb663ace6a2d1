"""The vectorized env API every simulator backend implements.

Conventions (all backends):

- **Batched numpy.** `obs` is an array `(num_envs, *obs_shape)` or, for dict observation
  spaces (LIBERO cameras + proprioception), a dict of such arrays. Rewards are float64,
  `terminated`/`truncated` bool, all shaped `(num_envs,)`.
- **Same-step auto-reset.** When env i's episode ends at a `step`, that same call resets
  it: `obs[i]` is already the first observation of the next episode, the last observation
  of the finished one is in `info["final_obs"][i]`, and `info["final_mask"][i]` is True
  (`terminated[i]`/`truncated[i]` say why). No step is spent on a dummy action, and
  bootstrapping uses `final_obs` where `truncated`.
- **Seeding.** `reset(seed=s)` seeds env i (global index i of the whole vector env) with
  `s + i`; `reset()` without a seed after construction uses the seed given to
  `make_vector_env`. Auto-resets draw from each env's own generator, so a trajectory is a
  pure function of the seed and the actions.
- **Episode bookkeeping.** Each finished episode becomes an `EpisodeStats`, collected
  until `pop_finished_episodes()` returns and clears them.
- **Sub-groups.** `split(k)` returns k views over disjoint, contiguous ranges of envs.
  Views share the simulators and bookkeeping of their parent but each steps only its own
  envs, so an env worker can step group g while the policy computes actions for group
  g+1 (pipelined rollout); views own disjoint envs, so different threads may step
  different views at the same time.
"""

from __future__ import annotations

import abc
from dataclasses import dataclass, field
from typing import Any

import gymnasium as gym
import numpy as np
import numpy.typing as npt

Observation = npt.NDArray[Any] | dict[str, npt.NDArray[Any]]


@dataclass(frozen=True)
class EpisodeStats:
    """Summary of one finished episode."""

    env_index: int
    """Global index of the env (within the whole vector env) that ran the episode."""
    episode_return: float
    """Undiscounted sum of the episode's rewards."""
    length: int
    """Number of steps in the episode."""
    terminated: bool
    """True if the episode ended in a terminal state, False if it was truncated."""
    success: bool | None = None
    """Whether the task reported success at any step; None when the task has no notion."""


@dataclass(frozen=True)
class StepResult:
    """What one batched `step` returns."""

    obs: Observation
    """Observations after the step (first observation of a new episode where one ended)."""
    reward: npt.NDArray[np.float64]
    """Rewards, shape (num_envs,)."""
    terminated: npt.NDArray[np.bool_]
    """Episode reached a terminal state, shape (num_envs,)."""
    truncated: npt.NDArray[np.bool_]
    """Episode was cut by a time limit, shape (num_envs,)."""
    info: dict[str, Any] = field(default_factory=dict)
    """Batched extras: `final_mask`, `final_obs`, and `success` when the task defines it."""

    @property
    def done(self) -> npt.NDArray[np.bool_]:
        """terminated | truncated."""
        return self.terminated | self.truncated


class VectorEnv(abc.ABC):
    """A batch of `num_envs` simulators stepped together; see the module docstring."""

    @property
    @abc.abstractmethod
    def num_envs(self) -> int:
        """Number of envs in this (view of the) vector env."""

    @property
    @abc.abstractmethod
    def single_observation_space(self) -> gym.Space[Any]:
        """Observation space of one env."""

    @property
    @abc.abstractmethod
    def single_action_space(self) -> gym.Space[Any]:
        """Action space of one env."""

    @property
    def observation_space(self) -> gym.Space[Any]:
        """Batched observation space, leading dimension `num_envs`."""
        return gym.vector.utils.batch_space(self.single_observation_space, self.num_envs)

    @property
    def action_space(self) -> gym.Space[Any]:
        """Batched action space; `action_space.sample()` is a valid `step` argument."""
        return gym.vector.utils.batch_space(self.single_action_space, self.num_envs)

    @abc.abstractmethod
    def reset(self, *, seed: int | None = None) -> tuple[Observation, dict[str, Any]]:
        """Reset every env (seeding env i with `seed + i` if given); discard open episodes."""

    @abc.abstractmethod
    def step(self, actions: npt.ArrayLike) -> StepResult:
        """Step every env with `actions[i]`, auto-resetting finished episodes in place."""

    @abc.abstractmethod
    def render(self) -> npt.NDArray[np.uint8]:
        """Offscreen RGB frames of every env, shape (num_envs, height, width, 3)."""

    @abc.abstractmethod
    def split(self, num_groups: int) -> list[VectorEnv]:
        """`num_groups` views over disjoint contiguous ranges of envs (pipeline stages)."""

    @abc.abstractmethod
    def pop_finished_episodes(self) -> list[EpisodeStats]:
        """Episodes of this view's envs finished since the last call, in finishing order."""

    @abc.abstractmethod
    def get_attr(self, name: str) -> list[Any]:
        """Attribute `name` of each env of this view (e.g. LIBERO's `instruction`)."""

    @abc.abstractmethod
    def close(self) -> None:
        """Release the simulators (closing any view closes the whole vector env)."""

    @property
    @abc.abstractmethod
    def total_steps(self) -> int:
        """Env steps taken by this view so far (num_envs per batched step)."""

    def __enter__(self) -> VectorEnv:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
