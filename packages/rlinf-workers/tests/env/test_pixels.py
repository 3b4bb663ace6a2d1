"""Pixel observations: rendered frames as uint8 (3, H, W), final frames before auto-reset."""

import os

import numpy as np

os.environ.setdefault("MUJOCO_GL", "egl")  # before anything imports mujoco

from rlinf.workers.embodied import InlinePolicyLink
from rlinf.workers.embodied.rollout import PolicyRolloutConfig, PolicyRolloutWorker
from rlinf.workers.env import Trajectory
from rlinf.workers.models import PolicyConfig

from .conftest import CONTEXT


def test_pixel_env_observes_frames_and_final_frames(make_env):
    env = make_env(num_envs=2, pixels=(16, 24), max_episode_steps=3, instruction="balance")
    assert env.observation_space.shape == (3, 16, 24)
    assert env.instruction == "balance"
    policy = PolicyRolloutWorker(CONTEXT, config=PolicyRolloutConfig(
        policy=PolicyConfig(obs_shape=(3, 16, 24), action_dim=1), num_threads=1))
    link = InlinePolicyLink(policy)
    rollout = env.rollout(num_steps=4, sink=link, source=link)
    traj = Trajectory.concat(rollout.trajectories)
    assert traj.obs.shape == (4, 2, 3, 16, 24) and traj.obs.dtype == np.uint8
    assert traj.obs.std() > 0  # real frames, not blank buffers
    assert traj.truncated[2].all()  # 3-step limit: the third step ends every episode
    assert len(rollout.episodes) == 2
