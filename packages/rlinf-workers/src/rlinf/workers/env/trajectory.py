"""`Trajectory`: what one rollout of a stage group produced, time-major numpy arrays."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, fields
from typing import Any

import numpy as np
import numpy.typing as npt

from rlinf.comm import Batch
from rlinf.workers.errors import ShapeError

__all__ = ["Trajectory", "TrajectoryBuilder"]

_F32 = npt.NDArray[np.float32]
_BOOL = npt.NDArray[np.bool_]


@dataclass(frozen=True)
class Trajectory:
    """`T` steps of `n` envs; every array is ``[T, n, ...]`` except `env_indices` ``[n]``."""

    obs: npt.NDArray[Any]
    """Observation each action was taken in, ``[T, n, *obs_shape]``."""
    actions: npt.NDArray[Any]
    """Actions as sampled (before clipping to the action space), ``[T, n, *action_shape]``."""
    log_probs: _F32
    """Log-probability of each action under the rollout policy."""
    values: _F32
    """Critic estimate of `obs`."""
    next_values: _F32
    """Value of the observation after the step: the next step's value, the episode's final
    observation where it ended (used by GAE only after a truncation), or the bootstrap value
    after the last step."""
    rewards: _F32
    """Rewards of the steps."""
    terminated: _BOOL
    """The episode reached a terminal state at this step."""
    truncated: _BOOL
    """The episode was cut by its time limit at this step."""
    env_indices: npt.NDArray[np.int64]
    """Global index of each env (column) within the env worker's vector env."""

    @property
    def num_steps(self) -> int:
        """T."""
        return int(self.rewards.shape[0])

    @property
    def num_envs(self) -> int:
        """n."""
        return int(self.rewards.shape[1])

    @staticmethod
    def concat(parts: Sequence[Trajectory]) -> Trajectory:
        """Join trajectories of the same length along the env axis (stage groups → one)."""
        if not parts:
            raise ShapeError("expected at least one trajectory to concatenate, got none")
        lengths = {p.num_steps for p in parts}
        if len(lengths) != 1:
            raise ShapeError(f"expected trajectories of one length, got lengths {sorted(lengths)}")
        joined: dict[str, Any] = {}
        for f in fields(Trajectory):
            axis = 0 if f.name == "env_indices" else 1
            joined[f.name] = np.concatenate([getattr(p, f.name) for p in parts], axis=axis)
        return Trajectory(**joined)

    def to_batch(self, *, step: int) -> Batch:
        """The trajectory as one `rlinf.comm` message (zero-copy arrays) of iteration `step`."""
        return Batch({f.name: getattr(self, f.name) for f in fields(Trajectory)},
                     meta={"step": step})

    @staticmethod
    def from_batch(batch: Batch, *, step: int) -> Trajectory:
        """Inverse of `to_batch`, with arrays copied out of the message (received views are
        read-only and valid only while the message is held); refuses another iteration's."""
        if int(batch.meta.get("step", -1)) != step:
            raise ShapeError(f"received the trajectory of iteration {batch.meta.get('step')} "
                             f"while running iteration {step}")
        missing = [f.name for f in fields(Trajectory) if f.name not in batch.tensors]
        if missing:
            raise ShapeError(f"a trajectory message lacks {missing}")
        return Trajectory(**{f.name: np.array(batch.tensors[f.name])
                             for f in fields(Trajectory)})


class TrajectoryBuilder:
    """Collects one stage group's steps; the env worker feeds it in protocol order."""

    def __init__(self, env_indices: Sequence[int]) -> None:
        self._env_indices = np.asarray(env_indices, dtype=np.int64)
        self._obs: list[npt.NDArray[Any]] = []
        self._actions: list[npt.NDArray[Any]] = []
        self._log_probs: list[_F32] = []
        self._values: list[_F32] = []
        self._final_values: list[_F32] = []
        self._rewards: list[_F32] = []
        self._terminated: list[_BOOL] = []
        self._truncated: list[_BOOL] = []

    def add_policy(self, obs: npt.NDArray[Any], reply: dict[str, npt.NDArray[Any]]) -> None:
        """Record the policy's answer for `obs`: action, log-prob and value of step t, and
        the value of the final observation of step t-1 (meaningful where it ended)."""
        # Copies: a reply received over a channel may be a view into a shared-memory
        # segment that the transport recycles once the message is consumed.
        if self._rewards:
            self._final_values.append(np.array(reply["final_value"], dtype=np.float32))
        self._obs.append(obs)
        self._actions.append(np.array(reply["action"]))
        self._log_probs.append(np.array(reply["log_prob"], dtype=np.float32))
        self._values.append(np.array(reply["value"], dtype=np.float32))

    def add_step(self, reward: npt.NDArray[Any], terminated: _BOOL, truncated: _BOOL) -> None:
        """Record what the env returned for step t."""
        self._rewards.append(np.asarray(reward, dtype=np.float32))
        self._terminated.append(np.asarray(terminated, dtype=bool))
        self._truncated.append(np.asarray(truncated, dtype=bool))

    def finish(self, bootstrap: dict[str, npt.NDArray[Any]]) -> Trajectory:
        """Close the trajectory with the reply to the observation after the last step."""
        self._final_values.append(np.array(bootstrap["final_value"], dtype=np.float32))
        count = len(self._rewards)
        if not count or len(self._values) != count or len(self._final_values) != count:
            raise ShapeError(
                f"expected one policy reply per step and a bootstrap reply, got {count} steps, "
                f"{len(self._values)} replies, {len(self._final_values)} final values"
            )
        values = np.stack(self._values)
        following = np.concatenate(
            [values[1:], np.array(bootstrap["value"], dtype=np.float32)[None]], axis=0)
        terminated, truncated = np.stack(self._terminated), np.stack(self._truncated)
        next_values = np.where(terminated | truncated, np.stack(self._final_values), following)
        return Trajectory(
            obs=np.stack(self._obs), actions=np.stack(self._actions),
            log_probs=np.stack(self._log_probs), values=values,
            next_values=next_values.astype(np.float32), rewards=np.stack(self._rewards),
            terminated=terminated, truncated=truncated, env_indices=self._env_indices.copy(),
        )
