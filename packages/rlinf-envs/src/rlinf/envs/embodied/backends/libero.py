"""LIBERO backend (extra `libero`): robosuite manipulation suites with camera observations.

Names: `libero_spatial`, `libero_object`, `libero_goal`, `libero_10`, `libero_90` (env i
runs task i mod the suite's task count) or `<suite>/<task id>` (every env runs that task).
Observations are a dict: `image` and `wrist_image` (H, W, 3 uint8, rotated upright) and
`state` (end-effector position and quaternion, gripper joints: 9 floats). Each reset loads
one of the task's fixed initial states, chosen by the env's seeded generator. The reward
is LIBERO's sparse success signal; an episode terminates on success and is truncated at
the suite's customary step limit.

LIBERO quirks handled here: importing `libero.libero` asks on stdin for a dataset path
unless a config file exists (we write one under `LIBERO_CONFIG_PATH`), and its scene assets
are not in the PyPI package — LIBERO downloads them from the Hugging Face Hub on first use;
without them we raise AssetsMissingError saying how to fetch them. robosuite 1.4.0 (pinned
by libero 0.1.1) breaks on MuJoCo >= 3.10 (`mj_fullM` signature, then a joint-type
assertion): the extra pins `mujoco<3.10`, so LIBERO needs its own environment apart from
one with MuJoCo 4.
"""

from __future__ import annotations

import importlib.util
import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import gymnasium as gym
import numpy as np

from rlinf.envs._extras import import_extra
from rlinf.envs.embodied.backends.headless import configure_headless_gl
from rlinf.envs.embodied.loop import SingleEnv
from rlinf.envs.errors import AssetsMissingError, MissingExtraError, UnknownEnvError

SUITE_STEP_LIMITS = {
    "libero_spatial": 220, "libero_object": 280, "libero_goal": 300,
    "libero_10": 520, "libero_90": 400,
}


def is_libero_name(name: str) -> bool:
    """Whether `name` addresses a LIBERO suite (`<suite>` or `<suite>/<task id>`)."""
    return name.split("/", 1)[0] in SUITE_STEP_LIMITS


# Where LIBERO looks for its scene assets: inside the package, then its Hub download cache.
_ASSET_CACHE = Path.home() / ".cache" / "libero" / "assets"
_ASSETS_HELP = (
    "LIBERO's scene assets are not part of the PyPI package. Fetch them once, on a machine "
    "with network access, with: python -c 'from libero.libero.utils.download_utils import "
    "download_assets_from_huggingface as d; d()' (Hugging Face Hub repo "
    "jadechoghari/libero-assets, saved to ~/.cache/libero/assets), or copy that folder here"
)


def _package_root() -> Path:
    spec = importlib.util.find_spec("libero")
    if spec is None or not spec.submodule_search_locations:
        raise MissingExtraError("LIBERO suites", "libero", "libero")
    return Path(next(iter(spec.submodule_search_locations))) / "libero"


def _check_assets(root: Path) -> None:
    """Fail fast, instead of LIBERO trying a download and then a missing XML file."""
    if not any((base / "scenes").is_dir() for base in (root / "assets", _ASSET_CACHE)):
        raise AssetsMissingError(
            f"no LIBERO assets in {root / 'assets'} or {_ASSET_CACHE}. {_ASSETS_HELP}")


def _ensure_config() -> None:
    """Write LIBERO's path config before its import would prompt for one on stdin."""
    root = _package_root()
    config_dir = Path(os.environ.setdefault(
        "LIBERO_CONFIG_PATH", str(Path.home() / ".cache" / "rlinf" / "libero")))
    config = config_dir / "config.yaml"
    if config.exists():
        return
    config_dir.mkdir(parents=True, exist_ok=True)
    paths = {
        "benchmark_root": root, "bddl_files": root / "bddl_files",
        "init_states": root / "init_files", "datasets": root.parent / "datasets",
        "assets": root / "assets",
    }
    config.write_text("".join(f"{key}: {value}\n" for key, value in paths.items()))


class LiberoEnv:
    """One LIBERO task behind the numpy `SingleEnv` protocol."""

    def __init__(self, suite: Any, task_id: int, *, render_size: tuple[int, int],
                 max_episode_steps: int, env_kwargs: Mapping[str, Any]) -> None:
        libero: Any = import_extra("libero.libero", extra="libero", feature="LIBERO suites")
        envs_module: Any = import_extra("libero.libero.envs", extra="libero",
                                        feature="LIBERO suites")
        task = suite.get_task(task_id)
        bddl = Path(libero.get_libero_path("bddl_files")) / task.problem_folder / task.bddl_file
        height, width = render_size
        self._env = envs_module.OffScreenRenderEnv(
            bddl_file_name=str(bddl), camera_heights=height, camera_widths=width,
            **env_kwargs)
        self._init_states = suite.get_task_init_states(task_id)
        self.instruction: str = task.language
        self._max_steps = max_episode_steps
        self._elapsed = 0
        self._rng = np.random.default_rng()
        self.observation_space: gym.Space[Any] = gym.spaces.Dict({
            "image": gym.spaces.Box(0, 255, (height, width, 3), np.uint8),
            "wrist_image": gym.spaces.Box(0, 255, (height, width, 3), np.uint8),
            "state": gym.spaces.Box(-np.inf, np.inf, (9,), np.float32),
        })
        self.action_space: gym.Space[Any] = gym.spaces.Box(-1.0, 1.0, (7,), np.float32)
        self._last_frame: np.ndarray[Any, Any] | None = None

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

    def reset(self, *, seed: int | None = None) -> tuple[Any, dict[str, Any]]:
        if seed is not None:
            self._rng = np.random.default_rng(seed)
            self._env.seed(seed)
        self._env.reset()
        state = self._init_states[int(self._rng.integers(len(self._init_states)))]
        raw = self._env.set_init_state(state)
        self._elapsed = 0
        return self._obs(raw), {"instruction": self.instruction}

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


def make_envs(
    name: str,
    *,
    num_envs: int,
    render_size: tuple[int, int],
    max_episode_steps: int | None,
    env_kwargs: Mapping[str, Any],
) -> list[SingleEnv]:
    """`num_envs` LIBERO envs for `<suite>` or `<suite>/<task id>`."""
    suite_name, _, task_part = name.partition("/")
    if suite_name not in SUITE_STEP_LIMITS:
        raise UnknownEnvError(
            f"unknown LIBERO suite {suite_name!r}; expected one of {sorted(SUITE_STEP_LIMITS)}")
    _ensure_config()
    _check_assets(_package_root())
    configure_headless_gl()
    benchmark: Any = import_extra("libero.libero.benchmark", extra="libero",
                                  feature="LIBERO suites")
    suite = benchmark.get_benchmark_dict()[suite_name]()
    count = suite.get_num_tasks()
    if task_part and not (task_part.isdigit() and int(task_part) < count):
        raise UnknownEnvError(f"{suite_name} has tasks 0..{count - 1}; got {task_part!r}")
    steps = max_episode_steps or SUITE_STEP_LIMITS[suite_name]
    return [
        LiberoEnv(suite, int(task_part) if task_part else i % count, render_size=render_size,
                  max_episode_steps=steps, env_kwargs=env_kwargs)
        for i in range(num_envs)
    ]
