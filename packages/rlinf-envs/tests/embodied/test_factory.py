"""Backend selection, missing extras, and the optional backends when they are installed."""

from __future__ import annotations

import numpy as np
import pytest

from rlinf.envs import (
    EnvsError,
    MissingExtraError,
    RenderError,
    UnknownEnvError,
)
from rlinf.envs._extras import has_module
from rlinf.envs.embodied import make_vector_env, resolve_backend

HAS_MANISKILL = has_module("mani_skill")


def test_resolve_backend() -> None:
    assert resolve_backend("HalfCheetah-v5") == "gymnasium"
    assert resolve_backend("PickCube-v1") == "maniskill"
    assert resolve_backend("libero_spatial") == "libero"
    assert resolve_backend("libero_goal/3") == "libero"


def test_unknown_env_names_the_choices() -> None:
    with pytest.raises(UnknownEnvError, match=r"HalfCheetah-v5.*PickCube-v1.*libero_spatial"):
        make_vector_env("NoSuchEnv-v9", num_envs=1)
    with pytest.raises(UnknownEnvError, match="gymnasium has no env"):
        make_vector_env("NoSuchEnv-v9", num_envs=1, backend="gymnasium")
    with pytest.raises(UnknownEnvError, match="unknown LIBERO suite"):
        make_vector_env("libero_nowhere", num_envs=1, backend="libero")
    # A KeyError subclass whose message reads normally.
    error = UnknownEnvError("plain message")
    assert str(error) == "plain message" and isinstance(error, KeyError | EnvsError)


@pytest.mark.skipif(HAS_MANISKILL, reason="mani_skill installed: missing-extra path unreachable")
def test_maniskill_without_extra_names_it() -> None:
    with pytest.raises(MissingExtraError, match=r"rlinf-envs\[maniskill\]") as info:
        make_vector_env("PickCube-v1", num_envs=1)
    assert info.value.extra == "maniskill"
    assert isinstance(info.value, ImportError)


def test_missing_extra_error_pickles() -> None:
    import pickle

    error = MissingExtraError("ManiSkill3 task", "maniskill", "mani_skill")
    copy = pickle.loads(pickle.dumps(error))
    assert str(copy) == str(error) and copy.extra == "maniskill"


@pytest.mark.skipif(not HAS_MANISKILL, reason="ManiSkill3 not installed (extra maniskill)")
def test_maniskill_pick_cube_state() -> None:
    try:
        env = make_vector_env("PickCube-v1", num_envs=2, seed=0)
    except RenderError as exc:
        pytest.skip(f"ManiSkill needs Vulkan here: {exc}")
    assert resolve_backend("PickCube-v1") == "maniskill"  # also once ManiSkill registered it
    obs, _ = env.reset()
    assert isinstance(obs, np.ndarray) and obs.shape[0] == 2 and obs.dtype == np.float32
    actions = np.random.default_rng(0).uniform(-1, 1, (12, *env.action_space.shape))
    first = [env.step(a) for a in actions]
    assert first[-1].reward.shape == (2,) and first[-1].info["success"].dtype == bool
    # Same seed, same actions, same trajectory.
    obs_again, _ = env.reset(seed=0)
    np.testing.assert_array_equal(obs, obs_again)
    again = [env.step(a) for a in actions]
    np.testing.assert_allclose(first[-1].obs, again[-1].obs, rtol=1e-5, atol=1e-6)
    env.close()


@pytest.mark.skipif(not HAS_MANISKILL, reason="ManiSkill3 not installed (extra maniskill)")
def test_maniskill_sharded_over_processes_steps_the_same_trajectory() -> None:
    """ManiSkill's CPU sim is one env per instance, stepped in a loop: sharded over env
    processes (both cores stepping), the envs see the same observations, rewards and
    success flags as in one process, and the reset info crosses the process boundary."""
    try:
        local = make_vector_env("PickCube-v1", num_envs=4, seed=3)
    except RenderError as exc:
        pytest.skip(f"ManiSkill needs Vulkan here: {exc}")
    sharded = make_vector_env("PickCube-v1", num_envs=4, seed=3, processes=2)
    try:
        np.testing.assert_allclose(local.reset()[0], sharded.reset()[0], rtol=1e-5, atol=1e-6)
        actions = np.random.default_rng(1).uniform(-1, 1, (8, *local.action_space.shape))
        for action in actions:
            one, two = local.step(action), sharded.step(action)
            np.testing.assert_allclose(one.obs, two.obs, rtol=1e-5, atol=1e-6)
            np.testing.assert_allclose(one.reward, two.reward, rtol=1e-5, atol=1e-6)
            np.testing.assert_array_equal(one.info["success"], two.info["success"])
    finally:
        local.close()
        sharded.close()
