"""Envs sharded over worker processes: the same trajectories as in one process, no lost or
duplicated transitions over 100k steps, a killed process named in a typed error, and no
process left after close."""

from __future__ import annotations

import os
import signal
import time

import numpy as np
import pytest

from rlinf.envs import ConfigError, EnvProcessError
from rlinf.envs.embodied import EnvProcessPool, LoopVectorEnv, make_vector_env
from rlinf.envs.embodied.factory import ShardSpec
from rlinf.envs.embodied.processes import process_layout


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    try:  # a zombie (exited, not yet reaped by anyone) counts as gone
        with open(f"/proc/{pid}/stat") as stat:
            return stat.read().split()[2] != "Z"
    except FileNotFoundError:
        return False


def _pair(name: str, num_envs: int, processes: int, **options: object
          ) -> tuple[LoopVectorEnv, LoopVectorEnv]:
    local = make_vector_env(name, num_envs=num_envs, backend="gymnasium", **options)
    sharded = make_vector_env(name, num_envs=num_envs, backend="gymnasium",
                              processes=processes, **options)
    assert isinstance(local, LoopVectorEnv) and isinstance(sharded, LoopVectorEnv)
    return local, sharded


def test_sharded_envs_follow_the_same_trajectories_as_local_ones() -> None:
    local, sharded = _pair("Hopper-v5", 5, 2, seed=3, max_episode_steps=15)
    try:
        np.testing.assert_array_equal(local.reset()[0], sharded.reset()[0])
        rng = np.random.default_rng(0)
        for _ in range(40):
            actions = rng.uniform(-1, 1, (5, 3))
            a, b = local.step(actions), sharded.step(actions)
            np.testing.assert_array_equal(a.obs, b.obs)
            np.testing.assert_array_equal(a.reward, b.reward)
            np.testing.assert_array_equal(a.info["final_obs"], b.info["final_obs"])
            np.testing.assert_array_equal(a.truncated, b.truncated)
        assert local.pop_finished_episodes() == sharded.pop_finished_episodes()
        # Stage groups (contiguous views) span both processes and step alike.
        for _ in range(10):
            for ga, gb in zip(local.split(2), sharded.split(2), strict=True):
                actions = rng.uniform(-1, 1, (ga.num_envs, 3))
                np.testing.assert_array_equal(ga.step(actions).obs, gb.step(actions).obs)
        np.testing.assert_array_equal(local.reset(seed=9)[0], sharded.reset(seed=9)[0])
        assert sharded.get_attr("spec")[0].id == "Hopper-v5"
    finally:
        local.close()
        sharded.close()


def test_no_transition_is_lost_or_duplicated_over_100k_steps() -> None:
    """4 processes x 16 CartPole envs for 1,600 steps (102,400 transitions), every one equal
    to the in-process run's: a lost, repeated or misrouted transition would desynchronise
    an env's observations from then on."""
    local, sharded = _pair("CartPole-v1", 64, 4, seed=1)
    try:
        np.testing.assert_array_equal(local.reset()[0], sharded.reset()[0])
        rng = np.random.default_rng(2)
        for _ in range(1600):
            actions = rng.integers(0, 2, 64)
            a, b = local.step(actions), sharded.step(actions)
            np.testing.assert_array_equal(a.obs, b.obs)
            np.testing.assert_array_equal(a.done, b.done)
        assert sharded.total_steps == 102_400
        episodes = sharded.pop_finished_episodes()
        assert episodes == local.pop_finished_episodes() and len(episodes) > 1000
    finally:
        local.close()
        sharded.close()


def test_a_killed_process_is_named_and_close_leaves_none_behind() -> None:
    pool = EnvProcessPool(ShardSpec("gymnasium", "CartPole-v1", (32, 32), None, {}, 4),
                          num_envs=4, processes=2)
    env = LoopVectorEnv(pool.envs, seed=0, name="CartPole-v1", on_close=pool.close)
    pids = pool.pids
    try:
        env.reset()
        env.step(np.zeros(4, dtype=np.int64))
        os.kill(pids[1], signal.SIGKILL)
        time.sleep(0.2)
        with pytest.raises(EnvProcessError, match=r"env process 1 \(pid \d+, exit code -9, "
                                                  r"envs \[1, 3\]\)"):
            env.step(np.zeros(4, dtype=np.int64))
    finally:
        env.close()
    assert not any(_alive(pid) for pid in pids)


def test_a_failing_builder_reports_the_child_traceback() -> None:
    with pytest.raises(EnvProcessError, match=r"env process 0 .*failed:[\s\S]*NoSuchEnv-v0"):
        EnvProcessPool(ShardSpec("gymnasium", "NoSuchEnv-v0", (32, 32), None, {}, 2),
                       num_envs=2, processes=1)


def test_bad_process_counts_are_refused() -> None:
    with pytest.raises(ConfigError, match=r"processes must be between 1 and num_envs=2"):
        make_vector_env("CartPole-v1", num_envs=2, processes=3)
    with pytest.raises(ConfigError, match="batches its own"):
        make_vector_env("HalfCheetah-v5", num_envs=2, backend="mujoco", processes=2)


def test_stage_groups_stepped_from_two_threads_get_their_own_replies() -> None:
    """Views over disjoint envs may be stepped from different threads (base.py); every
    process holds envs of both views, so both threads wait on the same pipes at once."""
    from concurrent.futures import ThreadPoolExecutor

    local, sharded = _pair("Hopper-v5", 8, 2, seed=5, max_episode_steps=7)
    try:
        np.testing.assert_array_equal(local.reset()[0], sharded.reset()[0])
        views = list(zip(local.split(2), sharded.split(2), strict=True))
        rng = np.random.default_rng(1)
        plans = [rng.uniform(-1, 1, (60, 4, 3)) for _ in views]

        def run(group: int) -> list[np.ndarray]:
            return [views[group][1].step(actions).obs for actions in plans[group]]

        with ThreadPoolExecutor(2) as pool:
            threaded = list(pool.map(run, range(2)))
        for group, (view, _) in enumerate(views):
            for step, actions in enumerate(plans[group]):
                np.testing.assert_array_equal(view.step(actions).obs, threaded[group][step])
    finally:
        local.close()
        sharded.close()


def test_one_group_interleaves_and_several_keep_each_process_to_one_group() -> None:
    assert process_layout(6, 2) == [[0, 2, 4], [1, 3, 5]]
    assert process_layout(8, 2, groups=2) == [[0, 1, 2, 3], [4, 5, 6, 7]]
    assert process_layout(8, 4, groups=2) == [[0, 2], [4, 6], [1, 3], [5, 7]]
    assert process_layout(8, 2, groups=4) == [[0, 1, 4, 5], [2, 3, 6, 7]]
    for num_envs in range(1, 13):
        for groups in range(1, num_envs + 1):
            bounds = np.array_split(np.arange(num_envs), groups)
            group_of = {int(i): g for g, part in enumerate(bounds) for i in part}
            for processes in range(1, num_envs + 1):
                layout = process_layout(num_envs, processes, groups)
                assert sorted(i for owned in layout for i in owned) == list(range(num_envs))
                assert all(layout), (num_envs, processes, groups)  # no idle process
                served = [{group_of[i] for i in owned} for owned in layout]
                if processes >= groups:
                    assert all(len(g) == 1 for g in served), (num_envs, processes, groups)


def test_a_pool_laid_out_for_groups_steps_as_the_local_envs() -> None:
    local = make_vector_env("Hopper-v5", num_envs=4, backend="gymnasium", seed=2,
                            max_episode_steps=9)
    sharded = make_vector_env("Hopper-v5", num_envs=4, backend="gymnasium", seed=2,
                              max_episode_steps=9, processes=2, stage_groups=2)
    try:
        np.testing.assert_array_equal(local.reset()[0], sharded.reset()[0])
        rng = np.random.default_rng(4)
        for _ in range(20):
            for ga, gb in zip(local.split(2), sharded.split(2), strict=True):
                actions = rng.uniform(-1, 1, (ga.num_envs, 3))
                np.testing.assert_array_equal(ga.step(actions).obs, gb.step(actions).obs)
        assert local.pop_finished_episodes() == sharded.pop_finished_episodes()
    finally:
        local.close()
        sharded.close()
