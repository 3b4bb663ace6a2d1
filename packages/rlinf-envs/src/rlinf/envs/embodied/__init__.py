"""Embodied simulators behind one vectorized API (`VectorEnv`, `make_vector_env`).

Conventions (auto-reset, seeding, bookkeeping, sub-groups) are documented in
`rlinf.envs.embodied.base`.
"""

from rlinf.envs.embodied.backends.mujoco_batch import MujocoVectorEnv
from rlinf.envs.embodied.base import EpisodeStats, Observation, StepResult, VectorEnv
from rlinf.envs.embodied.factory import (
    BACKENDS,
    ShardSpec,
    VectorEnvConfig,
    make_vector_env,
    resolve_backend,
    sharded_vector_env,
)
from rlinf.envs.embodied.loop import LoopVectorEnv, SingleEnv
from rlinf.envs.embodied.processes import EnvProcessPool, RemoteEnv

__all__ = [
    "BACKENDS",
    "EnvProcessPool",
    "EpisodeStats",
    "LoopVectorEnv",
    "MujocoVectorEnv",
    "Observation",
    "RemoteEnv",
    "ShardSpec",
    "SingleEnv",
    "StepResult",
    "VectorEnv",
    "VectorEnvConfig",
    "make_vector_env",
    "resolve_backend",
    "sharded_vector_env",
]
