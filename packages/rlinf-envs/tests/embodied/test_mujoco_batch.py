"""The batched MuJoCo backend against gymnasium's own step: same seeds and actions, same results."""

from __future__ import annotations

import threading
from typing import Any

import gymnasium as gym
import numpy as np
import pytest

from rlinf.envs import ConfigError
from rlinf.envs.embodied import (
    LoopVectorEnv,
    MujocoVectorEnv,
    StepResult,
    VectorEnv,
    VectorEnvConfig,
    make_vector_env,
)
from rlinf.envs.errors import EnvStepError

TASKS = ("HalfCheetah-v5", "Hopper-v5", "Walker2d-v5", "Ant-v5", "InvertedDoublePendulum-v5",
         "InvertedPendulum-v5")
STEPS = 1000


def _actions(space: gym.Space[Any], num_envs: int, steps: int, seed: int) -> list[np.ndarray]:
    """float32 actions as a policy sends them, a third of them outside the bounds."""
    assert isinstance(space, gym.spaces.Box)
    rng = np.random.default_rng(seed)
    return [rng.uniform(1.5 * space.low, 1.5 * space.high, (num_envs, *space.shape))
            .astype(np.float32) for _ in range(steps)]


def _assert_same_step(expected: StepResult, actual: StepResult, step: int) -> None:
    where = f"differs at step {step}"
    np.testing.assert_array_equal(actual.obs, expected.obs, err_msg=f"obs {where}")
    np.testing.assert_array_equal(actual.reward, expected.reward, err_msg=f"reward {where}")
    np.testing.assert_array_equal(actual.terminated, expected.terminated,
                                  err_msg=f"terminated {where}")
    np.testing.assert_array_equal(actual.truncated, expected.truncated,
                                  err_msg=f"truncated {where}")
    for key in ("final_mask", "final_obs"):
        np.testing.assert_array_equal(actual.info[key], expected.info[key],
                                      err_msg=f"{key} {where}")
    assert actual.reward.dtype == np.float64 and actual.terminated.dtype == np.bool_


def _run_both(name: str, *, seed: int, threads: int, num_envs: int = 4,
              max_episode_steps: int | None = 250, **env_kwargs: Any) -> int:
    """Step gymnasium's loop and the batched backend side by side; return episodes ended."""
    oracle = make_vector_env(name, num_envs=num_envs, seed=seed, backend="gymnasium",
                             max_episode_steps=max_episode_steps, env_kwargs=env_kwargs)
    batched = make_vector_env(name, num_envs=num_envs, seed=seed, backend="mujoco",
                              max_episode_steps=max_episode_steps, env_kwargs=env_kwargs,
                              threads=threads)
    with oracle, batched:
        assert isinstance(batched, MujocoVectorEnv) and not isinstance(oracle, MujocoVectorEnv)
        np.testing.assert_array_equal(batched.reset()[0], oracle.reset()[0])
        for step, actions in enumerate(_actions(oracle.single_action_space, num_envs,
                                                STEPS, seed)):
            _assert_same_step(oracle.step(actions), batched.step(actions), step)
        episodes = oracle.pop_finished_episodes()
        assert batched.pop_finished_episodes() == episodes
        assert batched.total_steps == oracle.total_steps == num_envs * STEPS
    return len(episodes)


@pytest.mark.parametrize("name", TASKS)
@pytest.mark.parametrize("seed", [0, 7, 123])
def test_batched_step_equals_gymnasium_for_1000_steps(name: str, seed: int) -> None:
    # Two physics threads for one seed in three, so both paths are held to gymnasium's step.
    episodes = _run_both(name, seed=seed, threads=2 if seed == 7 else 1)
    assert episodes > 0  # resets, terminations or truncations were exercised too


@pytest.mark.parametrize(("name", "env_kwargs"), [
    ("HalfCheetah-v5", {"ctrl_cost_weight": 0.3, "forward_reward_weight": 2.0,
                        "exclude_current_positions_from_observation": False}),
    ("Hopper-v5", {"healthy_z_range": (0.9, 2.0), "healthy_reward": 0.5,
                   "terminate_when_unhealthy": False}),
    ("Ant-v5", {"include_cfrc_ext_in_observation": False, "contact_cost_weight": 1e-3,
                "healthy_z_range": (0.3, 1.0)}),
])
def test_env_kwargs_act_as_in_gymnasium(name: str, env_kwargs: dict[str, Any]) -> None:
    _run_both(name, seed=1, threads=1, max_episode_steps=None, **env_kwargs)


def test_auto_batches_known_mujoco_tasks_and_loops_over_the_rest() -> None:
    with make_vector_env("HalfCheetah-v5", num_envs=2) as cheetah:
        assert isinstance(cheetah, MujocoVectorEnv)
    with make_vector_env("Swimmer-v5", num_envs=2) as swimmer:
        assert type(swimmer) is LoopVectorEnv
    with VectorEnvConfig("Hopper-v5", num_envs=3, threads=2).make() as hopper:
        assert isinstance(hopper, MujocoVectorEnv) and hopper.threads == 2


def test_bad_backend_options_say_what_to_use() -> None:
    with pytest.raises(ConfigError, match=r"Swimmer-v5.*backend='auto' or 'gymnasium'"):
        make_vector_env("Swimmer-v5", num_envs=2, backend="mujoco")
    with pytest.raises(ConfigError, match="threads must be >= 1"):
        make_vector_env("HalfCheetah-v5", num_envs=2, threads=0)


def test_views_step_the_same_physics_as_the_whole_env() -> None:
    # One thread steps the views in turn here; views stepped from threads at once are
    # covered by LoopVectorEnv's own test (the views own disjoint envs).
    whole = make_vector_env("Walker2d-v5", num_envs=5, seed=4, threads=2)
    split = make_vector_env("Walker2d-v5", num_envs=5, seed=4, threads=2)
    with whole, split:
        whole.reset()
        split.reset()
        views: list[VectorEnv] = split.split(2)
        assert [v.num_envs for v in views] == [3, 2]
        assert all(isinstance(v, MujocoVectorEnv) for v in views)  # batched, not the loop
        for actions in _actions(whole.single_action_space, 5, 200, seed=2):
            expected = whole.step(actions)
            first, second = views[0].step(actions[:3]), views[1].step(actions[3:])
            for field in ("obs", "reward", "terminated", "truncated"):
                np.testing.assert_array_equal(
                    np.concatenate([getattr(first, field), getattr(second, field)]),
                    getattr(expected, field), err_msg=field)
            np.testing.assert_array_equal(
                np.concatenate([first.info["final_obs"], second.info["final_obs"]]),
                expected.info["final_obs"])
        finished = sorted(views[0].pop_finished_episodes() + views[1].pop_finished_episodes(),
                          key=lambda e: (e.env_index, e.length, e.episode_return))
        assert finished == sorted(whole.pop_finished_episodes(),
                                  key=lambda e: (e.env_index, e.length, e.episode_return))


def test_closing_a_view_stops_the_thread_pool_and_refuses_steps() -> None:
    env = make_vector_env("HalfCheetah-v5", num_envs=4, threads=2)
    env.reset()
    view = env.split(2)[0]
    assert isinstance(env, MujocoVectorEnv)
    pool = env._physics.pool
    assert pool is not None
    view.close()
    assert env._physics.pool is None and pool._shutdown
    with pytest.raises(Exception, match="closed"):
        env.step(np.zeros((4, 6), dtype=np.float32))


@pytest.mark.parametrize("threads", [1, 2])
def test_close_from_another_thread_waits_for_the_step_in_flight(threads: int) -> None:
    env = make_vector_env("HalfCheetah-v5", num_envs=8, threads=threads)
    env.reset(seed=0)
    assert isinstance(env, MujocoVectorEnv)
    actions = np.zeros((8, 6), dtype=np.float32)
    stepped, errors = [0], []
    started = threading.Event()

    def loop() -> None:
        try:
            while True:
                env.step(actions)
                stepped[0] += 1
                started.set()
        except Exception as exc:  # the step after close: EnvStepError
            errors.append(exc)

    worker = threading.Thread(target=loop)
    worker.start()
    assert started.wait(30)
    env.close()  # while steps are running
    worker.join(30)
    assert not worker.is_alive() and stepped[0] > 0
    assert len(errors) == 1 and isinstance(errors[0], EnvStepError), errors
    assert "closed" in str(errors[0])
    with pytest.raises(EnvStepError, match="closed"):
        env.reset()
