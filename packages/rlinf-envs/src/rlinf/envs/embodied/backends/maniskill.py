"""ManiSkill3 backend (extra `maniskill`): state-observation tasks on the CPU simulator.

ManiSkill's CPU sim holds one env per instance (`num_envs=1`), so the vector env is a loop
over instances, like MuJoCo. Outputs are torch tensors with a batch dimension of 1; the
adapter turns them into numpy without it. CPU rendering needs SAPIEN's Vulkan renderer on
Mesa >= 24.3 (lavapipe); with older Mesa, creating the env fails with "failed to find a
rendering device" (or, with no Vulkan driver at all, "vk::createInstanceUnique:
ErrorIncompatibleDriver"), reported here as a RenderError with the fix. SAPIEN needs the
device even for state observations with `render_backend="none"`: building a scene creates
render materials.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import gymnasium as gym
import numpy as np

from rlinf.envs._extras import import_extra
from rlinf.envs.embodied.loop import SingleEnv
from rlinf.envs.errors import RenderError, UnknownEnvError

# Known task ids, so that a missing extra is reported as such instead of "unknown env".
MANISKILL_TASKS = (
    "PickCube-v1", "PushCube-v1", "StackCube-v1", "PullCube-v1", "LiftPegUpright-v1",
    "PegInsertionSide-v1", "PlugCharger-v1", "PickSingleYCB-v1", "PushT-v1", "RollBall-v1",
    "PokeCube-v1", "PlaceSphere-v1", "TurnFaucet-v1", "OpenCabinetDrawer-v1",
)

_VULKAN_HINT = (
    "ManiSkill on CPU needs a software Vulkan driver from Mesa >= 24.3 (Debian: "
    "apt-get install -t bookworm-backports mesa-vulkan-drivers libvulkan1)"
)


def _numpy(value: Any) -> Any:
    """Tensor (or nested dict of tensors) with batch dimension 1 → numpy without it."""
    if isinstance(value, dict):
        return {key: _numpy(item) for key, item in value.items()}
    if hasattr(value, "detach"):
        value = value.detach().cpu().numpy()
    array = np.asarray(value)
    return array[0] if array.ndim > 0 and array.shape[0] == 1 else array


class ManiSkillEnv:
    """One ManiSkill3 env (`num_envs=1`, CPU sim) behind the numpy `SingleEnv` protocol."""

    def __init__(self, env: Any) -> None:
        self._env = env
        unwrapped = env.unwrapped
        self.observation_space: gym.Space[Any] = unwrapped.single_observation_space
        self.action_space: gym.Space[Any] = unwrapped.single_action_space

    def reset(self, *, seed: int | None = None) -> tuple[Any, dict[str, Any]]:
        obs, info = self._env.reset(seed=seed)
        # numpy, not torch: a tensor pickled to an env process's parent would travel by
        # torch's fd sharing, which needs the parent's multiprocessing authkey.
        return _numpy(obs), {key: _numpy(value) for key, value in info.items()}

    def step(self, action: Any) -> tuple[Any, float, bool, bool, dict[str, Any]]:
        obs, reward, terminated, truncated, info = self._env.step(np.asarray(action)[None])
        info = {key: _numpy(value) for key, value in info.items()}
        return (_numpy(obs), float(_numpy(reward)), bool(_numpy(terminated)),
                bool(_numpy(truncated)), info)

    def render(self) -> Any:
        return _numpy(self._env.render())

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
    """`num_envs` CPU ManiSkill3 envs of task `name` with state observations."""
    import_extra("mani_skill.envs", extra="maniskill", feature=f"ManiSkill3 task {name!r}")
    torch: Any = import_extra("torch", extra="maniskill", feature="ManiSkill3")
    if name not in gym.registry:
        raise UnknownEnvError(
            f"ManiSkill3 has no task {name!r}; known: {', '.join(MANISKILL_TASKS)}")
    kwargs: dict[str, Any] = {
        "num_envs": 1, "sim_backend": "cpu", "obs_mode": "state",
        "render_mode": "rgb_array",
        "sensor_configs": {"width": render_size[1], "height": render_size[0]},
        "human_render_camera_configs": {"width": render_size[1], "height": render_size[0]},
    }
    if not torch.cuda.is_available():
        # ManiSkill defaults to CUDA rendering and only falls back after warning per env.
        kwargs["render_backend"] = "cpu"
    if max_episode_steps is not None:
        kwargs["max_episode_steps"] = max_episode_steps
    kwargs.update(env_kwargs)
    envs: list[SingleEnv] = []
    try:
        for _ in range(num_envs):
            envs.append(ManiSkillEnv(gym.make(name, **kwargs)))
    except RuntimeError as exc:
        for env in envs:
            env.close()
        message = str(exc).lower()
        # SAPIEN creates its render system while building the scene, even for state obs.
        if any(hint in message for hint in ("rendering device", "vulkan", "vk::")):
            raise RenderError(f"{exc}. {_VULKAN_HINT}") from exc
        raise
    return envs
