import numpy as np
import pytest

from rlinf.workers.env import Trajectory, TrajectoryBuilder
from rlinf.workers.errors import ShapeError


def _reply(value, final_value, action=0.0):
    n = len(value)
    return {"action": np.full((n, 1), action), "log_prob": np.zeros(n),
            "value": np.asarray(value, dtype=float), "final_value": np.asarray(final_value)}


def test_next_values_follow_episode_ends():
    b = TrajectoryBuilder([0, 1])
    b.add_policy(np.zeros((2, 3)), _reply([1.0, 2.0], [9.0, 9.0]))
    b.add_step(np.ones(2), np.array([False, True]), np.array([False, False]))
    b.add_policy(np.zeros((2, 3)), _reply([3.0, 4.0], [7.0, 8.0]))
    b.add_step(np.ones(2), np.array([False, False]), np.array([True, False]))
    traj = b.finish(_reply([5.0, 6.0], [11.0, 12.0]))
    assert traj.obs.shape == (2, 2, 3)
    # step 0: env 0 continues → value of step 1; env 1 terminated → its final value (8)
    np.testing.assert_array_equal(traj.next_values[0], [3.0, 8.0])
    # step 1: env 0 truncated → final value from the bootstrap reply; env 1 → bootstrap value
    np.testing.assert_array_equal(traj.next_values[1], [11.0, 6.0])
    assert traj.num_steps == 2 and traj.num_envs == 2


def test_finish_without_steps_is_a_shape_error():
    with pytest.raises(ShapeError):
        TrajectoryBuilder([0]).finish(_reply([0.0], [0.0]))


def test_concat_joins_env_axis_and_rejects_mismatched_lengths():
    def one(indices, steps):
        b = TrajectoryBuilder(indices)
        for _ in range(steps):
            b.add_policy(np.zeros((len(indices), 2)), _reply([0.0] * len(indices),
                                                            [0.0] * len(indices)))
            b.add_step(np.ones(len(indices)), np.zeros(len(indices), bool),
                       np.zeros(len(indices), bool))
        return b.finish(_reply([0.0] * len(indices), [0.0] * len(indices)))

    joined = Trajectory.concat([one([0, 1], 3), one([2], 3)])
    assert joined.rewards.shape == (3, 3)
    np.testing.assert_array_equal(joined.env_indices, [0, 1, 2])
    with pytest.raises(ShapeError):
        Trajectory.concat([one([0], 2), one([1], 3)])
    with pytest.raises(ShapeError):
        Trajectory.concat([])


def test_a_trajectory_travels_as_one_message_of_its_iteration():
    b = TrajectoryBuilder([0, 1])
    b.add_policy(np.arange(4.0).reshape(2, 2), _reply([0.5, 0.25], [1.0, 2.0]))
    b.add_step(np.ones(2), np.zeros(2, bool), np.array([False, True]))
    trajectory = b.finish(_reply([0.0, 0.0], [3.0, 4.0]))
    batch = trajectory.to_batch(step=7)
    assert batch.meta == {"step": 7}
    back = Trajectory.from_batch(batch, step=7)
    for name in ("obs", "actions", "rewards", "truncated", "env_indices", "next_values"):
        np.testing.assert_array_equal(getattr(back, name), getattr(trajectory, name))
    back.rewards[0, 0] = 9.0  # a copy, writable, independent of the message
    assert trajectory.rewards[0, 0] == 1.0
    with pytest.raises(ShapeError, match="iteration 7 while running iteration 8"):
        Trajectory.from_batch(batch, step=8)
