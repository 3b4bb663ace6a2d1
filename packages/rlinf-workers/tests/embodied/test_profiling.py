"""The actor's profile points: thread counts interleaved, each the median of several
updates (one update per count once priced a plan 5x too fast)."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
import torch

from rlinf.sched import Measurement
from rlinf.workers.embodied import EmbodiedActorConfig, PolicyRolloutConfig, profiling
from rlinf.workers.embodied.profiling import synthetic_trajectory
from rlinf.workers.embodied.roles.policy_role import build_rollout_policy
from rlinf.workers.models import PolicyConfig
from rlinf.workers.runtime import WorkerContext

POLICY = PolicyConfig(obs_shape=(4,), action_dim=1, hidden_sizes=(8, 8))


def test_actor_thread_counts_take_turns_and_each_point_is_a_median(
        monkeypatch: pytest.MonkeyPatch) -> None:
    calls: list[int] = []
    durations = iter([0.0, 0.0,              # warm-ups (1 thread, 2 threads)
                      0.3, 0.9, 0.1, 0.2, 0.2, 0.05])  # 1, 2, 1, 2, 1, 2
    clock = [0.0]

    def fake_update(*_args: object) -> None:
        calls.append(torch.get_num_threads())
        clock[0] += next(durations)

    monkeypatch.setattr(profiling, "_train_and_publish", fake_update)
    monkeypatch.setattr(profiling.time, "perf_counter", lambda: clock[0])
    context = WorkerContext(role="profile", rank=0, world_size=1)
    policy = build_rollout_policy(context, PolicyRolloutConfig(policy=POLICY))
    traj = synthetic_trajectory(np.zeros((2, 4), np.float32), (1,), steps=3)
    points = profiling._actor_points(EmbodiedActorConfig(policy=POLICY), policy, traj,
                                     samples=6, actor_devices=(1, 2), repeats=3)
    assert calls == [1, 2, 1, 2, 1, 2, 1, 2]
    assert [(p.component, p.batch_size, p.num_devices) for p in points] == [
        ("actor", 6, 1), ("actor", 6, 2)]
    assert [p.seconds for p in points] == pytest.approx([0.2, 0.2])  # medians, not the last
    assert torch.get_num_threads() == 1


def test_the_actor_is_timed_at_least_three_times_per_thread_count(
        monkeypatch: pytest.MonkeyPatch) -> None:
    seen: list[int] = []
    real = profiling._actor_points

    def spy(*args: Any, **kwargs: Any) -> list[Measurement]:
        seen.append(kwargs["repeats"])
        return real(*args, **kwargs)

    monkeypatch.setattr(profiling, "_actor_points", spy)
    from .test_roles import env_config

    profile = profiling.measure_components(
        env=env_config(pipeline_stages=1), rollout=PolicyRolloutConfig(policy=POLICY),
        actor=EmbodiedActorConfig(policy=POLICY, epochs=1, num_minibatches=2),
        rollout_steps=4, batch_sizes=[2], repeats=1, actor_devices=(1, 2))
    assert seen == [profiling.MIN_REPEATS]
    assert {m.num_devices for m in profile.measurements if m.component == "actor"} == {1, 2}


def test_sizes_too_small_to_split_into_minibatches_get_no_actor_point() -> None:
    from .test_roles import env_config

    profile = profiling.measure_components(
        env=env_config(pipeline_stages=1), rollout=PolicyRolloutConfig(policy=POLICY),
        actor=EmbodiedActorConfig(policy=POLICY, epochs=1, num_minibatches=4),
        rollout_steps=2, batch_sizes=[1, 4], repeats=1, actor_devices=(1,))
    assert {m.batch_size for m in profile.measurements if m.component == "actor"} == {8}
    assert {m.batch_size for m in profile.measurements if m.component == "env"} == {1, 4}
