import numpy as np
import pytest

from rlinf.envs.errors import EnvStepError
from rlinf.workers.embodied import PolicyRolloutWorker, run_collocated, run_pipelined
from rlinf.workers.env import Trajectory
from rlinf.workers.errors import ShapeError

from .conftest import make_policy

FIELDS = ("obs", "actions", "rewards", "terminated", "truncated", "log_probs", "values")


def _rollout(make_env, driver, *, stages, name="HalfCheetah-v5", dims=(17, 6), steps=30):
    env = make_env(name, num_envs=8, pipeline_stages=stages, seed=11)
    policy = make_policy(*dims, seed=4)
    first = Trajectory.concat(driver(env, policy, num_steps=steps).trajectories)
    second = Trajectory.concat(driver(env, policy, num_steps=steps).trajectories)
    return first, second


@pytest.mark.parametrize("stages", [1, 2, 4])
def test_pipelined_matches_collocated_exactly(make_env, stages):
    # Same stage groups, so the same micro-batches reach the policy; only the schedule
    # (overlap or not) differs. Across different groupings, per-env sampling streams keep
    # actions equal up to float rounding: batched matmuls may round a row differently
    # depending on the micro-batch size (bit-identical for 8 vs 4 rows here, not for 2).
    reference = _rollout(make_env, run_collocated, stages=stages)
    pipelined = _rollout(make_env, run_pipelined, stages=stages)
    for ref, got in zip(reference, pipelined, strict=True):
        for field in FIELDS:
            np.testing.assert_array_equal(getattr(got, field), getattr(ref, field), err_msg=field)
        np.testing.assert_array_equal(got.next_values, ref.next_values)


def test_equivalence_holds_across_episode_ends(make_env):
    # InvertedPendulum ends episodes every few steps: auto-resets and final values matter.
    ref = _rollout(make_env, run_collocated, stages=2, name="InvertedPendulum-v5", dims=(4, 1))
    got = _rollout(make_env, run_pipelined, stages=2, name="InvertedPendulum-v5", dims=(4, 1))
    assert ref[0].terminated.any()
    for a, b in zip(ref, got, strict=True):
        for field in FIELDS:
            np.testing.assert_array_equal(getattr(b, field), getattr(a, field), err_msg=field)
        np.testing.assert_array_equal(b.next_values, a.next_values)


def test_different_seeds_give_different_actions(make_env):
    env_a = make_env(num_envs=2, seed=0)
    env_b = make_env(num_envs=2, seed=0)
    a = run_collocated(env_a, make_policy(4, 1, seed=0), num_steps=3).trajectories[0]
    b = run_collocated(env_b, make_policy(4, 1, seed=1), num_steps=3).trajectories[0]
    assert not np.array_equal(a.actions, b.actions)


def test_policy_failure_surfaces_instead_of_hanging(make_env):
    env = make_env("HalfCheetah-v5", num_envs=4, pipeline_stages=2)
    wrong: PolicyRolloutWorker = make_policy(5, 6)  # expects 5-d observations, gets 17
    with pytest.raises(ShapeError, match="observations"):
        run_pipelined(env, wrong, num_steps=3, timeout=60)


def test_env_failure_is_raised_not_the_policy_threads_follow_up(make_env):
    env = make_env("InvertedPendulum-v5", num_envs=2, pipeline_stages=2)
    env.env.close()  # using a closed vector env raises EnvStepError
    with pytest.raises(EnvStepError):
        run_pipelined(env, make_policy(4, 1), num_steps=2, timeout=60)
