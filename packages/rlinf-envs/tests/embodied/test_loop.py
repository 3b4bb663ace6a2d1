"""The vector-env contract on the default backend (gymnasium MuJoCo, CPU)."""

from __future__ import annotations

import threading

import gymnasium as gym
import numpy as np
import pytest

from rlinf.envs import ConfigError, EnvStepError, RenderError
from rlinf.envs.embodied import (
    LoopVectorEnv,
    StepResult,
    VectorEnv,
    VectorEnvConfig,
    make_vector_env,
)

PENDULUM = "InvertedPendulum-v5"  # terminates within tens of steps under random actions


def _actions(env: VectorEnv, steps: int, seed: int = 0) -> list[np.ndarray]:
    rng = np.random.default_rng(seed)
    space = env.single_action_space
    assert isinstance(space, gym.spaces.Box)
    return [rng.uniform(space.low, space.high, (env.num_envs, *space.shape)).astype(space.dtype)
            for _ in range(steps)]


def _rollout(env: VectorEnv, actions: list[np.ndarray]) -> list[StepResult]:
    return [env.step(a) for a in actions]


def test_same_step_auto_reset_matches_a_single_gymnasium_env() -> None:
    env = make_vector_env(PENDULUM, num_envs=2, seed=5)
    obs, _ = env.reset()
    oracle = gym.make(PENDULUM)
    expected, _ = oracle.reset(seed=5)  # env 0 is seeded with seed + 0
    np.testing.assert_array_equal(obs[0], expected)
    finished = 0
    for batch in _actions(env, 200):
        result = env.step(batch)
        o, r, term, trunc, _ = oracle.step(batch[0])
        assert result.reward[0] == r
        assert result.terminated[0] == term and result.truncated[0] == trunc
        if term or trunc:
            finished += 1
            assert result.info["final_mask"][0]
            np.testing.assert_array_equal(result.info["final_obs"][0], o)
            o, _ = oracle.reset()  # the next episode starts in the same step
        else:
            assert not result.info["final_mask"][0]
            assert not result.info["final_obs"][0].any()
        np.testing.assert_array_equal(result.obs[0], o)
    assert finished >= 2
    env.close()


def test_truncation_by_time_limit() -> None:
    env = make_vector_env("HalfCheetah-v5", num_envs=3, seed=0, max_episode_steps=4)
    env.reset()
    results = _rollout(env, _actions(env, 4))
    assert not any(r.done.any() for r in results[:3])
    assert results[-1].truncated.all() and not results[-1].terminated.any()
    episodes = env.pop_finished_episodes()
    assert sorted(e.env_index for e in episodes) == [0, 1, 2]
    assert all(e.length == 4 and not e.terminated and e.success is None for e in episodes)
    assert "success" not in results[-1].info  # locomotion tasks define no success
    env.close()


def _trajectory(seed: int, *, reset_seed: int | None = None) -> tuple[np.ndarray, np.ndarray]:
    env = make_vector_env(PENDULUM, num_envs=3, seed=seed)
    obs, _ = env.reset(seed=reset_seed)
    results = _rollout(env, _actions(env, 120))
    env.close()
    return np.stack([obs, *[r.obs for r in results]]), np.stack([r.reward for r in results])


def test_same_seed_same_trajectory() -> None:
    obs_a, rew_a = _trajectory(11)
    obs_b, rew_b = _trajectory(11)
    np.testing.assert_array_equal(obs_a, obs_b)  # auto-resets included
    np.testing.assert_array_equal(rew_a, rew_b)
    obs_c, _ = _trajectory(12)
    assert not np.array_equal(obs_a, obs_c)
    # reset(seed=s) is the same as constructing with seed s and resetting without one.
    obs_d, rew_d = _trajectory(0, reset_seed=11)
    np.testing.assert_array_equal(obs_a, obs_d)
    np.testing.assert_array_equal(rew_a, rew_d)


def test_episode_bookkeeping_matches_manual_sums() -> None:
    env = make_vector_env(PENDULUM, num_envs=3, seed=1)
    env.reset()
    running = np.zeros(3)
    lengths = np.zeros(3, dtype=int)
    expected: list[tuple[int, float, int, bool]] = []
    for batch in _actions(env, 150, seed=1):
        result = env.step(batch)
        running += result.reward
        lengths += 1
        for i in np.flatnonzero(result.done):
            expected.append((int(i), float(running[i]), int(lengths[i]),
                             bool(result.terminated[i])))
            running[i], lengths[i] = 0.0, 0
    episodes = env.pop_finished_episodes()
    assert len(episodes) == len(expected) > 3
    for stats, (index, ret, length, terminated) in zip(episodes, expected, strict=True):
        assert (stats.env_index, stats.length, stats.terminated) == (index, length, terminated)
        assert stats.episode_return == pytest.approx(ret, rel=1e-12)
    assert env.pop_finished_episodes() == []
    assert env.total_steps == 150 * 3
    env.close()


def test_reset_discards_open_episodes() -> None:
    env = make_vector_env("HalfCheetah-v5", num_envs=2, seed=0, max_episode_steps=3)
    env.reset()
    _rollout(env, _actions(env, 2))
    env.reset()
    _rollout(env, _actions(env, 3))
    assert [e.length for e in env.pop_finished_episodes()] == [3, 3]
    env.close()


@pytest.mark.parametrize("threaded", [False, True])
def test_group_stepping_equals_whole_stepping(threaded: bool) -> None:
    whole = make_vector_env(PENDULUM, num_envs=5, seed=3)
    parts = make_vector_env(PENDULUM, num_envs=5, seed=3)
    groups = parts.split(2)
    assert [g.num_envs for g in groups] == [3, 2]
    whole_obs, _ = whole.reset()
    group_obs = [g.reset()[0] for g in groups]
    np.testing.assert_array_equal(whole_obs, np.concatenate(group_obs))
    for batch in _actions(whole, 100, seed=3):
        expected = whole.step(batch)
        chunks = [batch[:3], batch[3:]]
        if threaded:
            results: list[StepResult | None] = [None, None]

            def run(k: int, chunks: list[np.ndarray] = chunks,
                    results: list[StepResult | None] = results) -> None:
                results[k] = groups[k].step(chunks[k])

            threads = [threading.Thread(target=run, args=(k,)) for k in range(2)]
            for t in threads:
                t.start()
            for t in threads:
                t.join()
            got = [r for r in results if r is not None]
        else:
            got = [g.step(c) for g, c in zip(groups, chunks, strict=True)]
        np.testing.assert_array_equal(expected.obs, np.concatenate([r.obs for r in got]))
        np.testing.assert_array_equal(expected.reward, np.concatenate([r.reward for r in got]))
        np.testing.assert_array_equal(
            expected.info["final_obs"], np.concatenate([r.info["final_obs"] for r in got]))
    first, second = groups[0].pop_finished_episodes(), groups[1].pop_finished_episodes()
    assert {e.env_index for e in first} <= {0, 1, 2}
    assert {e.env_index for e in second} <= {3, 4}
    reference = whole.pop_finished_episodes()
    assert sorted(first + second, key=lambda e: (e.env_index, e.length)) == sorted(
        reference, key=lambda e: (e.env_index, e.length))
    whole.close()
    parts.close()


def test_dict_observations() -> None:
    base = [gym.make(PENDULUM) for _ in range(2)]
    inner = base[0].observation_space
    space = gym.spaces.Dict({"state": inner, "doubled": inner})
    envs = [gym.wrappers.TransformObservation(e, lambda o: {"state": o, "doubled": 2 * o}, space)
            for e in base]
    env = LoopVectorEnv(envs, seed=0, name="dict-pendulum")
    obs, _ = env.reset()
    assert isinstance(obs, dict) and obs["state"].shape == (2, 4)
    np.testing.assert_array_equal(obs["doubled"], 2 * obs["state"])
    for batch in _actions(env, 60):
        result = env.step(batch)
        assert isinstance(result.obs, dict)
        np.testing.assert_array_equal(result.obs["doubled"], 2 * result.obs["state"])
    assert env.observation_space["state"].shape == (2, 4)  # type: ignore[index]
    env.close()


def test_render_frames() -> None:
    env = make_vector_env("HalfCheetah-v5", num_envs=2, seed=0, render_size=(48, 64))
    env.reset()
    try:
        frames = env.render()
    except RenderError as exc:
        pytest.skip(f"no headless GL here: {exc}")
    assert frames.shape == (2, 48, 64, 3) and frames.dtype == np.uint8
    assert frames.std() > 0  # a real image, not a blank buffer
    assert env.split(2)[1].render().shape == (1, 48, 64, 3)
    env.close()


def test_misuse_errors() -> None:
    env = make_vector_env(PENDULUM, num_envs=2, seed=0)
    with pytest.raises(EnvStepError, match="reset"):
        env.step(np.zeros((2, 1)))
    env.reset()
    with pytest.raises(EnvStepError, match=r"expected actions of shape \(2, 1\)"):
        env.step(np.zeros((3, 1)))
    with pytest.raises(EnvStepError, match="num_groups"):
        env.split(3)
    env.close()
    env.close()  # idempotent
    with pytest.raises(EnvStepError, match="closed"):
        env.reset()
    with pytest.raises(EnvStepError, match="at least one env"):
        LoopVectorEnv([])


def test_action_space_batches() -> None:
    env = make_vector_env("HalfCheetah-v5", num_envs=4, seed=0)
    assert env.action_space.shape == (4, 6)
    assert env.observation_space.shape == (4, 17)
    env.reset()
    assert env.step(env.action_space.sample()).obs.shape == (4, 17)
    env.close()


def test_context_manager_closes() -> None:
    with make_vector_env(PENDULUM, num_envs=1, seed=0) as env:
        env.reset()
    with pytest.raises(EnvStepError):
        env.reset()


def test_invalid_factory_arguments() -> None:
    with pytest.raises(ConfigError, match="num_envs"):
        make_vector_env(PENDULUM, num_envs=0)
    with pytest.raises(ConfigError, match="backend"):
        make_vector_env(PENDULUM, num_envs=1, backend="isaac")  # type: ignore[arg-type]
    with pytest.raises(ConfigError, match="max_episode_steps"):
        make_vector_env(PENDULUM, num_envs=1, max_episode_steps=0)


def test_config_builds_the_same_env() -> None:
    config = VectorEnvConfig(name=PENDULUM, num_envs=2, seed=4, max_episode_steps=7)
    from_config = config.make()
    direct = make_vector_env(PENDULUM, num_envs=2, seed=4, max_episode_steps=7)
    np.testing.assert_array_equal(from_config.reset()[0], direct.reset()[0])
    from_config.close()
    direct.close()


def test_get_attr_reads_through_wrappers() -> None:
    env = make_vector_env(PENDULUM, num_envs=3, seed=0)
    assert env.get_attr("frame_skip") == [2, 2, 2]  # an attribute of the unwrapped MuJoCo env
    assert len(env.split(3)[2].get_attr("frame_skip")) == 1
    with pytest.raises(EnvStepError, match="no attribute 'nonexistent'"):
        env.get_attr("nonexistent")
    env.close()
