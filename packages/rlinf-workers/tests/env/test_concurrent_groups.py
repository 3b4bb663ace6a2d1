"""Stage groups stepped concurrently when the envs live in worker processes: the same
trajectories as groups taking turns, a group resetting for seconds holds up no other, and a
failing group ends the rollout at once."""

from __future__ import annotations

import importlib
import os
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType
from typing import Any

import numpy as np
import pytest

from rlinf.comm import Batch
from rlinf.envs.embodied import sharded_vector_env
from rlinf.workers.env import EnvWorker, EnvWorkerConfig, KeyedQueue, Trajectory
from rlinf.workers.env import worker as worker_module
from rlinf.workers.env.group_threads import GroupThreads
from rlinf.workers.env.link import LinkTimeoutError
from rlinf.workers.telemetry import TraceRecorder

from ..embodied.reference import InlinePolicyLink
from .conftest import CONTEXT, make_policy

HERE = Path(__file__).parent


@pytest.fixture
def slow_env(monkeypatch: pytest.MonkeyPatch) -> Iterator[ModuleType]:
    """`slow_env` importable here and in env processes (they unpickle its builder)."""
    monkeypatch.syspath_prepend(str(HERE))
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join(
        [str(HERE), *filter(None, [os.environ.get("PYTHONPATH")])]))
    yield importlib.import_module("slow_env")
    sys.modules.pop("slow_env", None)


def test_concurrent_groups_follow_the_same_trajectories_as_turns(make_env) -> None:
    turns = make_env("Hopper-v5", num_envs=4, pipeline_stages=2, seed=6, max_episode_steps=7)
    threaded = make_env("Hopper-v5", num_envs=4, pipeline_stages=2, seed=6, max_episode_steps=7,
                        processes=2)
    assert not turns.concurrent_groups and threaded.concurrent_groups
    results = []
    for env in (turns, threaded):
        link = InlinePolicyLink(make_policy(11, 3, seed=2))
        first = env.rollout(num_steps=12, sink=link, source=link)
        env.reset(seed=11)  # as reset_every_iteration does: the groups reset at once
        results.append([first, env.rollout(num_steps=12, sink=link, source=link)])
    for a, b in zip(*results, strict=True):
        ta, tb = Trajectory.concat(a.trajectories), Trajectory.concat(b.trajectories)
        for field in ("obs", "actions", "rewards", "log_probs", "values", "next_values",
                      "terminated", "truncated"):
            np.testing.assert_array_equal(getattr(tb, field), getattr(ta, field), field)
        assert a.episodes == b.episodes and a.episodes


def test_a_group_resetting_for_seconds_holds_up_no_other_group(
        slow_env: ModuleType, monkeypatch: pytest.MonkeyPatch) -> None:
    # env 0 (group 0) ends its episode every 2 steps and then resets for 1.5 s; group 1's
    # envs never reset. Each group lives in its own process (process_layout).
    def make(name: str, **options: Any) -> Any:
        return sharded_vector_env(
            slow_env.SlowShard(frozenset({0}), 1.5, 2), num_envs=options["num_envs"],
            processes=options["processes"], seed=options["seed"], name=name,
            stage_groups=options["stage_groups"])

    monkeypatch.setattr(worker_module, "make_vector_env", make)
    env = EnvWorker(CONTEXT, config=EnvWorkerConfig("InvertedPendulum-v5", num_envs=4,
                                                    pipeline_stages=2, processes=2))
    try:
        link = InlinePolicyLink(make_policy(4, 1))
        trace = TraceRecorder("env", enabled=True)
        rollout = env.rollout(num_steps=6, sink=link, source=link, trace=trace)
    finally:
        env.shutdown()
    spans = trace.drain()
    ends = {g: [s.end for s in spans if s.args["stage"] == g] for g in (0, 1)}
    slow_steps = [s for s in spans if s.args["stage"] == 0 and s.end - s.start > 1.0]
    assert len(slow_steps) == 3  # steps 2, 4 and 6 end an episode and reset
    # group 1 took all its steps before group 0's first slow reset was over
    assert max(ends[1]) < slow_steps[0].end
    assert [e.env_index for e in rollout.episodes] == [0, 0, 0]


class _Silent:
    """An action source that never answers (a policy that is stuck)."""

    def get(self, *, key: str | None = None, timeout: float | None = None) -> Batch:
        time.sleep(timeout or 0)
        raise LinkTimeoutError(f"nothing under {key!r}")


def test_a_failing_group_stops_the_others_without_waiting_out_their_timeout() -> None:
    threads = GroupThreads()
    waited: list[float] = []

    def failing() -> None:
        raise RuntimeError("group 0 failed")

    def waiting() -> None:
        started = time.monotonic()
        try:
            threads.get(_Silent(), key="stage1", timeout=60.0)
        finally:
            waited.append(time.monotonic() - started)

    with pytest.raises(RuntimeError, match="group 0 failed"):
        threads.run([failing, waiting])
    assert waited and waited[0] < 10 * GroupThreads.CHECK_S


def test_no_groups_run_nothing() -> None:
    GroupThreads().run([])


def test_a_concurrent_get_still_times_out_after_its_timeout() -> None:
    queue = KeyedQueue()
    threads = GroupThreads()
    started = time.monotonic()
    with pytest.raises(LinkTimeoutError):
        threads.run([lambda: threads.get(queue, key="stage0", timeout=0.8)])
    assert time.monotonic() - started >= 0.8


def test_policy_serves_a_ready_stage_while_another_is_late() -> None:
    from rlinf.workers.embodied.roles.policy_role import serve_stages

    policy = make_policy(4, 1)
    to_policy, to_env = KeyedQueue(), KeyedQueue()

    class Link:
        def get(self, *, key: str | None = None, timeout: float | None = None) -> Batch:
            return to_policy.get(key=key, timeout=timeout)

        def put(self, item: Batch, *, key: str | None = None) -> None:
            to_env.put(item, key=key)

    def batch(stage: int) -> Batch:
        return Batch({"obs": np.zeros((2, 4), np.float32),
                      "final_obs": np.zeros((2, 4), np.float32),
                      "final_mask": np.zeros(2, bool), "env_index": np.arange(2) + 2 * stage},
                     meta={"bootstrap": False})

    failure: list[BaseException] = []

    def serve() -> None:
        try:
            serve_stages(policy, links=[(Link(), Link())], num_steps=2, num_stages=2,
                         timeout=30, trace=TraceRecorder("p", enabled=False), concurrent=True)
        except BaseException as exc:
            failure.append(exc)

    thread = threading.Thread(target=serve)
    thread.start()
    for _ in range(3):  # stage 1's whole rollout (2 steps and the bootstrap), stage 0 late
        to_policy.put(batch(1), key="stage1")
        to_env.get(key="stage1", timeout=30)
    for _ in range(3):
        to_policy.put(batch(0), key="stage0")
        to_env.get(key="stage0", timeout=30)
    thread.join(timeout=30)
    assert not failure and not thread.is_alive()
