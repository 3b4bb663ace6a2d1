"""Env and policy timed on two processes at once: the points that give the planner's fit its
data-parallel term, and the error a failing profiling process gives."""

from __future__ import annotations

from dataclasses import replace

import pytest

from rlinf.sched import Profile, fit_profile
from rlinf.workers.embodied import PolicyRolloutConfig
from rlinf.workers.embodied.parallel_profiling import (
    ParallelProfileError,
    measure_parallel,
    parallel_batch_sizes,
)
from rlinf.workers.errors import ConfigError
from rlinf.workers.models import PolicyConfig

from .test_roles import env_config

POLICY = PolicyConfig(obs_shape=(4,), action_dim=1, hidden_sizes=(8, 8))


def test_only_sizes_the_workers_split_evenly_are_measured() -> None:
    assert parallel_batch_sizes([1, 2, 3, 8, 8], 2) == (2, 8)
    assert parallel_batch_sizes([1, 4, 6], 3) == (6,)
    assert parallel_batch_sizes([1], 2) == ()


def test_two_processes_give_env_and_rollout_points_on_two_devices() -> None:
    points = measure_parallel(env=env_config(pipeline_stages=1),
                              rollout=PolicyRolloutConfig(policy=POLICY),
                              batch_sizes=[1, 2, 4], workers=2, repeats=1)
    assert sorted((p.component, p.batch_size, p.num_devices) for p in points) == [
        ("env", 2, 2), ("env", 4, 2), ("rollout", 2, 2), ("rollout", 4, 2)]
    assert all(p.seconds > 0 for p in points)
    # with one-device points beside them the fit prices two devices from these
    fitted = fit_profile(Profile((*points,)))
    assert fitted.time("env", batch_size=4, num_devices=2) > 0


def test_nothing_to_split_starts_no_process() -> None:
    assert measure_parallel(env=env_config(), rollout=PolicyRolloutConfig(policy=POLICY),
                            batch_sizes=[1], workers=2) == []


def test_a_failing_profiling_process_is_reported_with_its_error() -> None:
    with pytest.raises(ParallelProfileError, match="NoSuchTask-v0"):
        measure_parallel(env=replace(env_config(), env_name="NoSuchTask-v0"),
                         rollout=PolicyRolloutConfig(policy=POLICY), batch_sizes=[2],
                         workers=2, repeats=1)


def test_fewer_than_two_workers_is_refused() -> None:
    with pytest.raises(ConfigError, match="workers >= 2"):
        measure_parallel(env=env_config(), rollout=PolicyRolloutConfig(policy=POLICY),
                         batch_sizes=[2], workers=1)
