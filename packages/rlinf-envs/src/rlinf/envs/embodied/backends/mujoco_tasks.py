"""Observations, rewards and terminations of gymnasium's MuJoCo tasks, for a batch of envs.

Each task reads the same MuJoCo fields, in the same order of floating-point operations, as
gymnasium's v5 `step` of that task, but for a batch of envs at once: every field is gathered
into one ``(num_envs, ...)`` array, so the arithmetic is a few numpy calls per batch instead of
several per env. The weights and ranges come from the gymnasium env instance itself, so
``env_kwargs`` such as ``ctrl_cost_weight`` or ``healthy_z_range`` act as they do in
gymnasium. `tests/embodied/test_mujoco_batch.py` proves every task equal to gymnasium's step
on the same states and actions.

Only the v5 tasks are here: v4 and earlier read different fields (e.g. Ant v4's contact
forces), and a task with no entry keeps the plain loop over gymnasium's own `step`.
"""

from __future__ import annotations

import abc
from collections.abc import Sequence
from typing import Any, ClassVar

import numpy as np
import numpy.typing as npt

FloatArray = npt.NDArray[np.float64]
BoolArray = npt.NDArray[np.bool_]


def gather(datas: Sequence[Any], field: str) -> FloatArray:
    """`field` of every env's MjData stacked into one array ``(num_envs, *shape)``."""
    return np.array([getattr(data, field) for data in datas])


def control_cost(weight: float, actions: npt.NDArray[Any]) -> npt.NDArray[Any]:
    """gymnasium's ``weight * sum(action**2)`` per env, in the action's own dtype as there."""
    return weight * np.sum(np.square(actions), axis=1)  # type: ignore[no-any-return]


class BatchTask(abc.ABC):
    """One gymnasium MuJoCo task's `step` arithmetic over a batch of envs."""

    contact_forces: ClassVar[bool] = False
    """Whether the step reads ``cfrc_ext``, which needs `mj_rnePostConstraint` after physics."""

    def __init__(self, sim: Any) -> None:
        self.dt = float(sim.dt)

    @abc.abstractmethod
    def before(self, datas: Sequence[Any]) -> FloatArray:
        """What the reward needs from before the physics step (positions for velocities)."""

    @abc.abstractmethod
    def after(self, datas: Sequence[Any], actions: npt.NDArray[Any], before: FloatArray,
              obs: FloatArray) -> tuple[FloatArray, BoolArray]:
        """Write the observations into `obs`; return (reward, terminated) per env."""


class _Planar(BatchTask):
    """HalfCheetah, Hopper, Walker2d: forward progress of qpos[0], qpos[1:] and qvel observed."""

    clip_velocity: ClassVar[bool] = True
    healthy_reward: float = 0.0
    terminate_when_unhealthy: bool = False

    def __init__(self, sim: Any) -> None:
        super().__init__(sim)
        self.forward_weight = sim._forward_reward_weight
        self.ctrl_weight = sim._ctrl_cost_weight
        self.skip = int(bool(sim._exclude_current_positions_from_observation))

    def before(self, datas: Sequence[Any]) -> FloatArray:
        return np.array([data.qpos[0] for data in datas])

    def healthy(self, qpos: FloatArray, qvel: FloatArray) -> BoolArray | None:
        """Which envs are healthy; None where the task has no notion of it."""
        return None

    def after(self, datas: Sequence[Any], actions: npt.NDArray[Any], before: FloatArray,
              obs: FloatArray) -> tuple[FloatArray, BoolArray]:
        qpos, qvel = gather(datas, "qpos"), gather(datas, "qvel")
        width = qpos.shape[1] - self.skip
        obs[:, :width] = qpos[:, self.skip:]
        obs[:, width:] = np.clip(qvel, -10, 10) if self.clip_velocity else qvel
        forward = self.forward_weight * ((qpos[:, 0] - before) / self.dt)
        ctrl = control_cost(self.ctrl_weight, actions)
        healthy = self.healthy(qpos, qvel)
        if healthy is None:
            return forward - ctrl, np.zeros(len(datas), dtype=bool)
        reward = (forward + healthy * self.healthy_reward) - ctrl
        return reward, ~healthy & self.terminate_when_unhealthy


class HalfCheetah(_Planar):
    """HalfCheetah-v5: never terminates; velocities not clipped."""

    clip_velocity = False


class _Legged(_Planar):
    """Hopper and Walker2d: a survival bonus while healthy, ended when not."""

    def __init__(self, sim: Any) -> None:
        super().__init__(sim)
        self.healthy_reward = sim._healthy_reward
        self.terminate_when_unhealthy = bool(sim._terminate_when_unhealthy)
        self.z_range = sim._healthy_z_range
        self.angle_range = sim._healthy_angle_range

    def _upright(self, qpos: FloatArray) -> BoolArray:
        (min_z, max_z), (min_angle, max_angle) = self.z_range, self.angle_range
        z, angle = qpos[:, 1], qpos[:, 2]
        return (min_z < z) & (z < max_z) & (min_angle < angle) & (angle < max_angle)


class Hopper(_Legged):
    """Hopper-v5: also unhealthy when any of state_vector()[2:] leaves healthy_state_range."""

    def __init__(self, sim: Any) -> None:
        super().__init__(sim)
        self.state_range = sim._healthy_state_range

    def healthy(self, qpos: FloatArray, qvel: FloatArray) -> BoolArray:
        low, high = self.state_range
        state = np.concatenate([qpos[:, 2:], qvel], axis=1)
        in_range = np.all((low < state) & (state < high), axis=1)
        return in_range & self._upright(qpos)  # type: ignore[no-any-return]


class Walker2d(_Legged):
    """Walker2d-v5: healthy while its torso height and angle stay in range."""

    def healthy(self, qpos: FloatArray, qvel: FloatArray) -> BoolArray:
        return self._upright(qpos)


class Ant(BatchTask):
    """Ant-v5: planar progress of the main body, contact forces observed and penalised."""

    contact_forces = True

    def __init__(self, sim: Any) -> None:
        super().__init__(sim)
        self.forward_weight = sim._forward_reward_weight
        self.ctrl_weight = sim._ctrl_cost_weight
        self.contact_weight = sim._contact_cost_weight
        self.healthy_reward = sim._healthy_reward
        self.terminate_when_unhealthy = bool(sim._terminate_when_unhealthy)
        self.z_range = sim._healthy_z_range
        self.force_range = sim._contact_force_range
        self.body = int(sim.model.body(sim._main_body).id)
        self.skip = 2 * int(bool(sim._exclude_current_positions_from_observation))
        self.observe_forces = bool(sim._include_cfrc_ext_in_observation)

    def before(self, datas: Sequence[Any]) -> FloatArray:
        return np.array([data.xpos[self.body, :2] for data in datas])

    def after(self, datas: Sequence[Any], actions: npt.NDArray[Any], before: FloatArray,
              obs: FloatArray) -> tuple[FloatArray, BoolArray]:
        qpos, qvel = gather(datas, "qpos"), gather(datas, "qvel")
        forces = np.clip(gather(datas, "cfrc_ext"), *self.force_range)
        count = len(datas)
        position = qpos[:, self.skip:]
        obs[:, :position.shape[1]] = position
        obs[:, position.shape[1]:position.shape[1] + qvel.shape[1]] = qvel
        if self.observe_forces:
            obs[:, position.shape[1] + qvel.shape[1]:] = forces[:, 1:].reshape(count, -1)
        after = np.array([data.xpos[self.body, :2] for data in datas])
        x_velocity = ((after - before) / self.dt)[:, 0]
        min_z, max_z = self.z_range
        finite = np.isfinite(qpos).all(axis=1) & np.isfinite(qvel).all(axis=1)
        healthy = finite & (min_z <= qpos[:, 2]) & (qpos[:, 2] <= max_z)
        rewards = x_velocity * self.forward_weight + healthy * self.healthy_reward
        contact = self.contact_weight * np.sum(np.square(forces.reshape(count, -1)), axis=1)
        costs = control_cost(self.ctrl_weight, actions) + contact
        return rewards - costs, ~healthy & self.terminate_when_unhealthy


class InvertedDoublePendulum(BatchTask):
    """InvertedDoublePendulum-v5: ends when the tip drops to y <= 1."""

    def __init__(self, sim: Any) -> None:
        super().__init__(sim)
        self.healthy_reward = sim._healthy_reward

    def before(self, datas: Sequence[Any]) -> FloatArray:
        return np.empty((len(datas), 0))

    def after(self, datas: Sequence[Any], actions: npt.NDArray[Any], before: FloatArray,
              obs: FloatArray) -> tuple[FloatArray, BoolArray]:
        qpos, qvel = gather(datas, "qpos"), gather(datas, "qvel")
        tip = np.array([data.site_xpos[0] for data in datas])
        constraint = np.array([data.qfrc_constraint[0] for data in datas])
        links = qpos.shape[1] - 1
        obs[:, 0] = qpos[:, 0]
        obs[:, 1:1 + links] = np.sin(qpos[:, 1:])
        obs[:, 1 + links:1 + 2 * links] = np.cos(qpos[:, 1:])
        obs[:, 1 + 2 * links:1 + 2 * links + qvel.shape[1]] = np.clip(qvel, -10, 10)
        obs[:, -1] = np.clip(constraint, -10, 10)
        x, y = tip[:, 0], tip[:, 2]
        terminated = y <= 1
        v1, v2 = qvel[:, 1], qvel[:, 2]
        # gymnasium squares numpy scalars, which goes through pow(); an array's ** 2 is x * x,
        # one ulp away at times. float_power is pow() over the array.
        distance = 0.01 * np.float_power(x, 2) + np.float_power(y - 2, 2)
        velocity = 1e-3 * np.float_power(v1, 2) + 5e-3 * np.float_power(v2, 2)
        alive = self.healthy_reward * (~terminated).astype(np.int64)
        return alive - distance - velocity, terminated


class InvertedPendulum(BatchTask):
    """InvertedPendulum-v5: reward 1 per step until the pole leaves |angle| <= 0.2."""

    def before(self, datas: Sequence[Any]) -> FloatArray:
        return np.empty((len(datas), 0))

    def after(self, datas: Sequence[Any], actions: npt.NDArray[Any], before: FloatArray,
              obs: FloatArray) -> tuple[FloatArray, BoolArray]:
        qpos, qvel = gather(datas, "qpos"), gather(datas, "qvel")
        obs[:, :qpos.shape[1]] = qpos
        obs[:, qpos.shape[1]:] = qvel
        terminated = ~np.isfinite(obs).all(axis=1) | (np.abs(obs[:, 1]) > 0.2)
        return (~terminated).astype(np.float64), terminated


TASKS: dict[str, type[BatchTask]] = {
    "gymnasium.envs.mujoco.half_cheetah_v5:HalfCheetahEnv": HalfCheetah,
    "gymnasium.envs.mujoco.hopper_v5:HopperEnv": Hopper,
    "gymnasium.envs.mujoco.walker2d_v5:Walker2dEnv": Walker2d,
    "gymnasium.envs.mujoco.ant_v5:AntEnv": Ant,
    "gymnasium.envs.mujoco.inverted_double_pendulum_v5:InvertedDoublePendulumEnv":
        InvertedDoublePendulum,
    "gymnasium.envs.mujoco.inverted_pendulum_v5:InvertedPendulumEnv": InvertedPendulum,
}
"""Batched step arithmetic by gymnasium entry point."""
