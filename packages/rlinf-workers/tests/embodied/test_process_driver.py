import numpy as np
import pytest
import torch

from rlinf.workers.embodied import PolicyRolloutConfig, run_collocated
from rlinf.workers.embodied.process_driver import PolicyProcess, run_pipelined_process
from rlinf.workers.env import Trajectory
from rlinf.workers.errors import ShapeError, WorkerCallError
from rlinf.workers.models import PolicyConfig

from .conftest import make_policy


def test_policy_process_matches_collocated_and_takes_weights(make_env):
    config = PolicyRolloutConfig(policy=PolicyConfig(obs_shape=(4,), action_dim=1), seed=4,
                                 num_threads=1)
    local = make_policy(4, 1, seed=4)
    env_a = make_env(num_envs=4, pipeline_stages=2, seed=2)
    env_b = make_env(num_envs=4, pipeline_stages=2, seed=2)
    with PolicyProcess(config) as remote:
        for _ in range(2):  # the second round runs on updated weights on both sides
            ref = Trajectory.concat(run_collocated(env_a, local, num_steps=20).trajectories)
            got = Trajectory.concat(
                run_pipelined_process(env_b, remote, num_steps=20).trajectories)
            for field in ("obs", "actions", "rewards", "values", "next_values", "log_probs"):
                np.testing.assert_array_equal(getattr(got, field), getattr(ref, field))
            weights = {k: v * 0.5 for k, v in local.get_weights().items()}
            local.set_weights(weights)
            remote.set_weights(weights)


def test_policy_process_failure_surfaces(make_env):
    config = PolicyRolloutConfig(policy=PolicyConfig(obs_shape=(5,), action_dim=1),
                                 num_threads=1)  # the env sends 4-d observations
    env = make_env(num_envs=2)
    with PolicyProcess(config) as remote:
        with pytest.raises(WorkerCallError, match="no_such_parameter"):
            remote.set_weights({"no_such_parameter": torch.zeros(1)})
        # the process survives a failed command; a failed rollout raises the policy's error
        with pytest.raises(ShapeError, match="observations"):
            run_pipelined_process(env, remote, num_steps=3, timeout=60)
