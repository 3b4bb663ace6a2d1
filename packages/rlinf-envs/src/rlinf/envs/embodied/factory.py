"""`make_vector_env`: one entry point for every simulator backend."""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

from rlinf.envs._extras import has_module
from rlinf.envs.embodied.backends import gym_backend, libero, maniskill, mujoco_batch
from rlinf.envs.embodied.base import VectorEnv
from rlinf.envs.embodied.loop import LoopVectorEnv, SingleEnv
from rlinf.envs.embodied.processes import EnvProcessPool, ShardBuilder
from rlinf.envs.errors import ConfigError, MissingExtraError, UnknownEnvError
from rlinf.envs.install_libero import INSTALL_HINT as LIBERO_INSTALL

Backend = Literal["auto", "mujoco", "gymnasium", "maniskill", "libero"]
BACKENDS: tuple[Backend, ...] = ("auto", "mujoco", "gymnasium", "maniskill", "libero")

_Builder = Callable[..., list[SingleEnv]]
_BUILDERS: dict[str, _Builder] = {
    "gymnasium": gym_backend.make_envs,
    "maniskill": maniskill.make_envs,
    "libero": libero.make_envs,
}


def resolve_backend(name: str) -> Literal["gymnasium", "maniskill", "libero"]:
    """The backend `backend="auto"` picks for `name`, or a clear error if there is none.

    LIBERO suite names go to LIBERO; known ManiSkill3 tasks, and ids that ManiSkill
    registered in gymnasium's registry, go to ManiSkill3 (which then raises
    MissingExtraError without the extra); other registered ids go to gymnasium. Anything
    else is looked up in ManiSkill's registry when it is installed, and is otherwise unknown.
    """
    if libero.is_libero_name(name):
        return "libero"
    if name in maniskill.MANISKILL_TASKS or gym_backend.entry_point(name).startswith("mani_skill"):
        return "maniskill"
    if gym_backend.is_registered(name):
        return "gymnasium"
    if has_module("mani_skill.envs") and gym_backend.is_registered(name):
        return "maniskill"  # importing mani_skill.envs registered it
    raise UnknownEnvError(
        f"no backend knows env {name!r}: expected a gymnasium id (e.g. HalfCheetah-v5), a "
        f"ManiSkill3 task (e.g. PickCube-v1, extra 'maniskill') or a LIBERO suite "
        f"({', '.join(sorted(libero.SUITE_STEP_LIMITS))}, extra 'libero')"
    )


@dataclass(frozen=True)
class ShardSpec:
    """What an `EnvProcessPool` process builds: called with global env indices, it returns
    those envs among `num_envs` of `name` (a picklable `ShardBuilder`)."""

    backend: str
    name: str
    render_size: tuple[int, int]
    max_episode_steps: int | None
    env_kwargs: Mapping[str, Any]
    num_envs: int

    def __call__(self, indices: Sequence[int]) -> list[SingleEnv]:
        options: dict[str, Any] = {"render_size": self.render_size,
                                   "max_episode_steps": self.max_episode_steps,
                                   "env_kwargs": dict(self.env_kwargs)}
        if self.backend == "libero":
            return libero.make_envs(self.name, num_envs=self.num_envs, indices=indices,
                                    **options)
        return _BUILDERS[self.backend](self.name, num_envs=len(indices), **options)


def make_vector_env(
    name: str,
    *,
    num_envs: int,
    seed: int = 0,
    backend: Backend = "auto",
    render_size: tuple[int, int] = (128, 128),
    max_episode_steps: int | None = None,
    env_kwargs: Mapping[str, Any] | None = None,
    threads: int = 1,
    processes: int = 1,
    stage_groups: int = 1,
) -> VectorEnv:
    """A vector env of `num_envs` copies of `name` (see `rlinf.envs.embodied.base`).

    `seed` seeds env i with `seed + i` at the first `reset()`; `render_size` is the
    (height, width) of `render()` frames and camera observations; `max_episode_steps`
    overrides the task's time limit; `env_kwargs` go to the backend's constructor.
    `backend="auto"` steps the gymnasium MuJoCo tasks that `mujoco_batch` knows as one
    batch (`MujocoVectorEnv`, physics on `threads` threads) and every other gymnasium env in
    a loop; `backend="gymnasium"` forces the loop over gymnasium's own `step`.
    `processes > 1` shards the envs over that many worker processes stepped in parallel
    (`rlinf.envs.embodied.processes`; for slow simulators such as LIBERO's renderer or
    ManiSkill3's CPU sim, whose step is mostly Python holding the GIL rather than
    physics; not with the batched MuJoCo backend, which steps on `threads`);
    `stage_groups` is how many groups the caller will `split` the envs into (the processes
    are laid out so that no group waits behind another: `processes.process_layout`).
    Raises UnknownEnvError for names no backend knows, MissingExtraError naming the extra
    when the backend's package is not installed.
    """
    if backend not in BACKENDS:
        raise ConfigError(f"unknown backend {backend!r}; expected one of {BACKENDS}")
    if num_envs < 1:
        raise ConfigError(f"num_envs must be >= 1, got {num_envs}")
    if max_episode_steps is not None and max_episode_steps < 1:
        raise ConfigError(f"max_episode_steps must be >= 1 or None, got {max_episode_steps}")
    if len(render_size) != 2 or min(render_size) < 1:
        raise ConfigError(f"render_size must be (height, width) >= 1, got {render_size}")
    if threads < 1:
        raise ConfigError(f"threads must be >= 1, got {threads}")
    if backend == "mujoco" and not mujoco_batch.supports(name):
        raise ConfigError(
            f"backend 'mujoco' batches gymnasium's v5 MuJoCo tasks; {name!r} is not one of them "
            "(use backend='auto' or 'gymnasium')")
    if not 1 <= processes <= num_envs:
        raise ConfigError(f"processes must be between 1 and num_envs={num_envs}, got "
                          f"{processes}")
    chosen = resolve_backend(name) if backend in ("auto", "mujoco") else backend
    batched = backend == "mujoco" or (
        backend == "auto" and chosen == "gymnasium" and mujoco_batch.supports(name)
        and processes == 1)
    if processes > 1 and batched:
        raise ConfigError(f"processes > 1 shards loop-stepped simulators; {name!r} with "
                          f"backend {backend!r} batches its own (use threads)")
    shard = ShardSpec(chosen, name, (render_size[0], render_size[1]), max_episode_steps,
                      dict(env_kwargs or {}), num_envs)
    if processes > 1:
        return sharded_vector_env(shard, num_envs=num_envs, processes=processes, seed=seed,
                                  name=name, stage_groups=stage_groups)
    try:
        envs = shard(range(num_envs))
    except MissingExtraError:
        raise
    except ModuleNotFoundError as exc:
        if chosen == "gymnasium":
            raise  # a core dependency is broken: not something an extra fixes
        # A dependency of the extra itself (robosuite for LIBERO, sapien for ManiSkill).
        install = LIBERO_INSTALL if chosen == "libero" else None
        raise MissingExtraError(f"{chosen} env {name!r}", chosen, exc.name or "?",
                                install=install) from exc
    if batched:
        return mujoco_batch.MujocoVectorEnv(envs, name=name, seed=seed, threads=threads,
                                            max_episode_steps=max_episode_steps)
    return LoopVectorEnv(envs, seed=seed, name=name)


def sharded_vector_env(builder: ShardBuilder, *, num_envs: int, processes: int, seed: int,
                       name: str, stage_groups: int = 1) -> LoopVectorEnv:
    """A `LoopVectorEnv` over the envs `builder` makes in `processes` worker processes
    laid out for `stage_groups` groups (stopped when the vector env closes)."""
    pool = EnvProcessPool(builder, num_envs=num_envs, processes=processes,
                          groups=stage_groups)
    return LoopVectorEnv(pool.envs, seed=seed, name=name, on_close=pool.close)


@dataclass(frozen=True)
class VectorEnvConfig:
    """Everything `make_vector_env` needs, as one frozen value an app config can hold."""

    name: str
    """Env id: gymnasium id, ManiSkill3 task, or LIBERO `<suite>[/<task id>]`."""
    num_envs: int = 1
    """Number of envs (all pipeline groups together)."""
    seed: int = 0
    """Env i is seeded with seed + i at the first reset."""
    backend: Backend = "auto"
    """Simulator backend; auto picks it from the name."""
    render_size: tuple[int, int] = (128, 128)
    """(height, width) of rendered frames and camera observations."""
    max_episode_steps: int | None = None
    """Override of the task's time limit; None keeps the task's own."""
    env_kwargs: Mapping[str, Any] = field(default_factory=dict)
    """Extra keyword arguments for the backend's env constructor."""
    threads: int = 1
    """Threads stepping a batched MuJoCo backend's physics (one per core it may use)."""
    processes: int = 1
    """Worker processes the envs are sharded over (slow simulators; 1: this process)."""

    def make(self) -> VectorEnv:
        """Build the vector env this config describes."""
        return make_vector_env(
            self.name, num_envs=self.num_envs, seed=self.seed, backend=self.backend,
            render_size=self.render_size, max_episode_steps=self.max_episode_steps,
            env_kwargs=self.env_kwargs, threads=self.threads, processes=self.processes,
        )
