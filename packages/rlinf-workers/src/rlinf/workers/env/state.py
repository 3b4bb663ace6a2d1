"""Snapshots of running simulators, so a resumed run continues the same trajectories.

A checkpoint taken between iterations must let the next rollout produce exactly what an
uninterrupted run would have produced. For gymnasium MuJoCo tasks that is, per env: the
physics integration state (`mujoco.mj_getState` with ``mjSTATE_INTEGRATION``: time, qpos,
qvel, actuator activations, warm-start accelerations, ...), the body positions the last
step left (`xpos`, `xipos`: one integration behind qpos, and Ant's reward reads them before
it steps), the env's random generator (it draws the next auto-reset's initial state) and
the elapsed steps of its time-limit wrapper;
per vector env: the open episodes' bookkeeping (return, length, success so far). Restoring
into freshly built envs of the same task reproduces every later step bit for bit (tested,
auto-resets included).

Other backends (ManiSkill3, LIBERO) keep state this module cannot read; `capture_env_state`
raises `ConfigError` for them, naming the alternative: start every iteration from resets
seeded by (seed, step) (`EnvWorker.reset(seed=...)`), which needs no env state at all.
"""

from __future__ import annotations

import copy
from collections.abc import Iterator
from typing import Any

import numpy as np

from rlinf.envs.embodied import LoopVectorEnv, VectorEnv
from rlinf.workers.errors import ConfigError

__all__ = ["capture_env_state", "restore_env_state"]

_FORMAT = "rlinf-env-state/1"


def _layers(env: Any) -> Iterator[Any]:
    """The env and every wrapper or adapter below it (gymnasium's ``.env``, ours ``._env``)."""
    while env is not None:
        yield env
        env = getattr(env, "env", None) or getattr(env, "_env", None)


def _mujoco_env(env: Any, *, index: int) -> Any:
    unwrapped = getattr(env, "unwrapped", None)
    if unwrapped is None:  # our adapters hide gymnasium's .unwrapped one level down
        unwrapped = next((getattr(layer, "unwrapped", None) for layer in _layers(env)
                          if getattr(layer, "unwrapped", None) is not None), None)
    if unwrapped is None or not hasattr(unwrapped, "model") or not hasattr(unwrapped, "data"):
        raise ConfigError(
            f"env {index} ({type(unwrapped or env).__name__}) is not a gymnasium MuJoCo env: its "
            "state cannot be checkpointed. Start every iteration from seeded resets instead "
            "(EmbodiedSpec(reset_every_iteration=True)), which needs no env state")
    return unwrapped


def _vector(env: VectorEnv) -> LoopVectorEnv:
    if not isinstance(env, LoopVectorEnv):
        raise ConfigError(f"expected a LoopVectorEnv to checkpoint, got {type(env).__name__}")
    return env


def capture_env_state(env: VectorEnv) -> dict[str, Any]:
    """Everything needed to continue `env` (all its envs, views share it) exactly."""
    import mujoco

    shared = _vector(env)._shared  # bookkeeping of the envs and every split view
    spec = mujoco.mjtState.mjSTATE_INTEGRATION
    envs = []
    for index, single in enumerate(shared.envs):
        sim = _mujoco_env(single, index=index)
        physics = np.empty(mujoco.mj_stateSize(sim.model, spec))
        mujoco.mj_getState(sim.model, sim.data, physics, spec)
        envs.append({
            "physics": physics,
            # Body positions as the last mj_step left them: computed at the start of that
            # step, one integration behind qpos. Rewards read them before the next step (Ant's
            # forward progress), so a restore puts them back after its mj_forward.
            "xpos": sim.data.xpos.copy(), "xipos": sim.data.xipos.copy(),
            "rng": copy.deepcopy(sim.np_random.bit_generator.state),
            # The time limit's count is the open episode's length: a batched MuJoCo env
            # truncates on that length and never steps gymnasium's TimeLimit wrapper.
            "elapsed": [int(shared.lengths[index]) if hasattr(layer, "_elapsed_steps") else None
                        for layer in _layers(single)],
        })
    return {
        "format": _FORMAT, "envs": envs, "returns": shared.returns.copy(),
        "lengths": shared.lengths.copy(), "succeeded": list(shared.succeeded),
        "was_reset": shared.was_reset.copy(),
    }


def restore_env_state(env: VectorEnv, state: dict[str, Any]) -> None:
    """Put `env` (built like the captured one) into the captured state."""
    import mujoco

    if state.get("format") != _FORMAT:
        raise ConfigError(f"expected an env state of format {_FORMAT!r}, got "
                          f"{state.get('format')!r}")
    shared = _vector(env)._shared
    if len(state["envs"]) != len(shared.envs):
        raise ConfigError(f"the env state holds {len(state['envs'])} envs but this worker has "
                          f"{len(shared.envs)}: resume with the same num_envs")
    spec = mujoco.mjtState.mjSTATE_INTEGRATION
    for index, (single, saved) in enumerate(zip(shared.envs, state["envs"], strict=True)):
        sim = _mujoco_env(single, index=index)
        if mujoco.mj_stateSize(sim.model, spec) != len(saved["physics"]):
            raise ConfigError(f"env {index}: the saved physics state has {len(saved['physics'])} "
                              "numbers, this model needs a different count: resume the same task")
        mujoco.mj_setState(sim.model, sim.data, np.asarray(saved["physics"]), spec)
        mujoco.mj_forward(sim.model, sim.data)
        for field in ("xpos", "xipos"):
            if field in saved:  # states saved before these were kept recompute them
                getattr(sim.data, field)[:] = saved[field]
        sim.np_random.bit_generator.state = copy.deepcopy(saved["rng"])
        for layer, elapsed in zip(_layers(single), saved["elapsed"], strict=False):
            if elapsed is not None and hasattr(layer, "_elapsed_steps"):
                layer._elapsed_steps = elapsed
            if hasattr(layer, "_has_reset"):  # gymnasium's OrderEnforcing
                layer._has_reset = True
    shared.returns[:] = state["returns"]
    shared.lengths[:] = state["lengths"]
    shared.succeeded[:] = list(state["succeeded"])
    shared.was_reset[:] = state["was_reset"]
