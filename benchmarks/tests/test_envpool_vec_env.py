"""bench-embodied's envpool peer gives SB3 same-step resets (runs where the bench extra is)."""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pytest

pytest.importorskip("envpool")
pytest.importorskip("stable_baselines3")
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from envpool_vec_env import EnvpoolVecEnv


def test_finished_envs_restart_in_the_same_step_with_their_last_observation():
    env = EnvpoolVecEnv("Hopper-v5", num_envs=4, num_threads=2)
    try:
        obs = env.reset()
        assert obs.shape == (4, 11)
        rng = np.random.default_rng(0)
        ended = 0
        for _ in range(200):
            env.step_async(rng.uniform(-1, 1, (4, 3)).astype(np.float32))
            obs, rewards, dones, infos = env.step_wait()
            assert obs.shape == (4, 11) and rewards.shape == dones.shape == (4,)
            for index in np.flatnonzero(dones):
                last = infos[index]["terminal_observation"]
                assert last.shape == (11,) and not np.array_equal(last, obs[index])
                ended += 1
        assert ended > 0  # random actions topple Hopper within tens of steps
    finally:
        env.close()
