"""gymnasium backend: MuJoCo tasks (HalfCheetah-v5, Hopper-v5, ...) and any registered env.

gymnasium's own envs already follow the `SingleEnv` protocol, so this module only builds
them: rgb_array rendering at the requested size (the MuJoCo renderer is created lazily on
the first `render`, so it costs nothing until used) and no env checker (it adds a wrapper
call per step and only checks the first step).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import gymnasium as gym

from rlinf.envs.embodied.backends.headless import configure_headless_gl
from rlinf.envs.embodied.loop import SingleEnv
from rlinf.envs.errors import UnknownEnvError

MUJOCO_TASKS = (
    "Ant-v5", "HalfCheetah-v5", "Hopper-v5", "Humanoid-v5", "HumanoidStandup-v5",
    "InvertedDoublePendulum-v5", "InvertedPendulum-v5", "Pusher-v5", "Reacher-v5",
    "Swimmer-v5", "Walker2d-v5",
)


def is_registered(name: str) -> bool:
    """Whether gymnasium's registry knows `name`."""
    return name in gym.registry


def entry_point(name: str) -> str:
    """The registered entry point of `name` as text ("" when not registered)."""
    spec = gym.registry.get(name)
    if spec is None:
        return ""
    target = spec.entry_point
    if isinstance(target, str):
        return target
    # ManiSkill registers functools.partial(mani_skill.utils.registration.make, ...).
    target = getattr(target, "func", target)
    return f"{getattr(target, '__module__', '')}:{getattr(target, '__qualname__', '')}"


def is_mujoco(name: str) -> bool:
    """Whether `name` is a registered gymnasium MuJoCo env."""
    return entry_point(name).startswith("gymnasium.envs.mujoco")


def make_envs(
    name: str,
    *,
    num_envs: int,
    render_size: tuple[int, int],
    max_episode_steps: int | None,
    env_kwargs: Mapping[str, Any],
) -> list[SingleEnv]:
    """`num_envs` independent instances of the gymnasium env `name`."""
    if not is_registered(name):
        raise UnknownEnvError(
            f"gymnasium has no env {name!r}; MuJoCo tasks include {', '.join(MUJOCO_TASKS)}")
    kwargs: dict[str, Any] = {"render_mode": "rgb_array", "disable_env_checker": True}
    if is_mujoco(name):
        configure_headless_gl()
        kwargs["height"], kwargs["width"] = render_size
    if max_episode_steps is not None:
        kwargs["max_episode_steps"] = max_episode_steps
    kwargs.update(env_kwargs)
    return [gym.make(name, **kwargs) for _ in range(num_envs)]
