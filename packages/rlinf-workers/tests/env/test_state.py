"""Env state snapshots: a restored env worker continues exactly where the original was."""

import numpy as np
import pytest

from rlinf.workers.env import Trajectory
from rlinf.workers.errors import ConfigError

from ..embodied.reference import run_collocated
from .conftest import make_policy


@pytest.mark.parametrize("name,obs_dim,act_dim", [("InvertedPendulum-v5", 4, 1),
                                                  ("Hopper-v5", 11, 3),
                                                  ("Ant-v5", 105, 8)])  # reward reads xpos
def test_restored_worker_continues_the_same_trajectory(make_env, name, obs_dim, act_dim):
    options = {"num_envs": 3, "pipeline_stages": 1, "seed": 4, "max_episode_steps": 15}
    original = make_env(name, **options)
    policy = make_policy(obs_dim, act_dim, seed=1)
    run_collocated(original, policy, num_steps=11)  # mid-episode, after auto-resets
    saved, streams = original.state(), policy.state()
    expected = run_collocated(original, policy, num_steps=25)  # crosses more auto-resets

    restored = make_env(name, **{**options, "seed": 99})  # different start: state decides
    twin = make_policy(obs_dim, act_dim, seed=7)
    restored.load_state(saved)
    twin.load_state(streams)
    got = run_collocated(restored, twin, num_steps=25)
    a, b = Trajectory.concat(expected.trajectories), Trajectory.concat(got.trajectories)
    assert a.terminated.any() or a.truncated.any()
    for field in ("obs", "actions", "rewards", "log_probs", "values", "terminated", "truncated"):
        np.testing.assert_array_equal(getattr(b, field), getattr(a, field), err_msg=field)
    assert [(e.env_index, e.episode_return, e.length) for e in got.episodes] == [
        (e.env_index, e.episode_return, e.length) for e in expected.episodes]


def test_state_of_a_non_mujoco_task_is_refused_with_the_alternative(make_env):
    env = make_env("CartPole-v1", num_envs=2)
    with pytest.raises(ConfigError, match="reset_every_iteration"):
        env.state()


def test_state_of_another_task_is_refused(make_env):
    saved = make_env("InvertedPendulum-v5", num_envs=2).state()
    with pytest.raises(ConfigError, match="same"):
        make_env("Hopper-v5", num_envs=2).load_state(saved)
    with pytest.raises(ConfigError, match="num_envs"):
        make_env("InvertedPendulum-v5", num_envs=3).load_state(saved)
