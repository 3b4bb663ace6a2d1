"""`EnvWorkerConfig`: what an env worker simulates and how it splits it into stages."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from typing import Any

from rlinf.workers.errors import ConfigError

__all__ = ["EnvWorkerConfig"]


@dataclass(frozen=True)
class EnvWorkerConfig:
    """Environments of one env worker."""

    env_name: str
    """Task id, e.g. "HalfCheetah-v5" (any id `rlinf.envs.embodied.make_vector_env` knows)."""
    num_envs: int
    """Simulators this worker owns."""
    pipeline_stages: int = 1
    """Stage groups the envs are split into; group g steps while the policy computes the
    actions of group g+1. 1 means no pipelining."""
    seed: int = 0
    """Env i is seeded with seed + i (see `rlinf.envs.embodied.base`)."""
    max_episode_steps: int | None = None
    """Override of the task's time limit (None: the task's own)."""
    same_start_group_size: int = 1
    """Consecutive blocks of this many envs start every episode from one identical state
    (GRPO compares the episodes of a block); 1 gives every env its own states."""
    env_kwargs: Mapping[str, Any] = field(default_factory=dict)
    """Keyword arguments for the task's constructor."""
    pixels: tuple[int, int] | None = None
    """Observe rendered frames of this (height, width) as ``uint8 (3, H, W)`` instead of the
    task's state vector (gymnasium tasks; for VLA policies). None: the task's observations."""
    instruction: str = ""
    """Language instruction of the task for VLA policies ("" : the task id)."""
    threads: int = 1
    """Threads stepping the physics of batched MuJoCo tasks (`MujocoVectorEnv`): one per core
    this worker may use beside whatever else runs in its process."""
    processes: int = 1
    """Processes the envs are sharded over, stepped in parallel
    (`rlinf.envs.embodied.processes`): for slow simulators such as LIBERO's renderer. 1: the
    worker's own process."""
    concurrent_groups: bool = True
    """With several processes and stage groups: each group in processes of its own, stepped
    in its own thread, so that a group resetting holds up no other (`EnvWorker.
    concurrent_groups`). False: every group spans all processes and the groups take turns."""
    first_env: int = 0
    """Index in the run of this worker's env 0, where several env workers split a run's
    envs (`shard`): env i of this worker is env ``first_env + i`` of the run — its seed
    offset, and the index its observations carry (the policy's sampling stream)."""

    def __post_init__(self) -> None:
        if self.num_envs < 1:
            raise ConfigError(f"num_envs must be >= 1, got {self.num_envs}")
        if not 1 <= self.pipeline_stages <= self.num_envs:
            raise ConfigError(f"pipeline_stages must be in [1, num_envs={self.num_envs}], "
                              f"got {self.pipeline_stages}")
        if self.pixels is not None and (len(self.pixels) != 2 or min(self.pixels) < 1):
            raise ConfigError(f"pixels must be (height, width) >= 1 or None, got {self.pixels}")
        if self.threads < 1:
            raise ConfigError(f"threads must be >= 1, got {self.threads}")
        if not 1 <= self.processes <= self.num_envs:
            raise ConfigError(f"processes must be in [1, num_envs={self.num_envs}], got "
                              f"{self.processes}")
        size = self.same_start_group_size
        if size < 1 or self.num_envs % size:
            raise ConfigError(f"same_start_group_size must be >= 1 and divide num_envs="
                              f"{self.num_envs}, got {size}")
        if self.first_env < 0:
            raise ConfigError(f"first_env must be >= 0, got {self.first_env}")

    @property
    def process_stage_groups(self) -> int:
        """The stage groups the env processes are laid out for
        (`rlinf.envs.embodied.processes.process_layout`): a process set per group when the
        groups run concurrently, else one group spanning every process."""
        return self.pipeline_stages if self.concurrent_groups else 1

    def shard(self, rank: int, ranks: int) -> EnvWorkerConfig:
        """The envs of env worker `rank` of `ranks` that split this config's envs as data
        parallelism splits a batch: an equal contiguous share (seeded as they are here: env
        i of the share is seeded with this config's seed + its index here), in as many stage
        groups as here, each group an equal share of a group here (so a stage group's call
        over all ranks is one of this config's stage groups, as the planner prices it), and
        at most `processes` processes each."""
        if ranks < 1 or not 0 <= rank < ranks:
            raise ConfigError(f"env worker rank {rank} outside [0, {ranks})")
        if ranks == 1:
            return self
        if self.num_envs % (ranks * self.pipeline_stages):
            raise ConfigError(f"{ranks} env workers split {self.pipeline_stages} stage groups "
                              f"of num_envs={self.num_envs} evenly only when {ranks} divides "
                              f"a stage group's {self.num_envs / self.pipeline_stages:g} envs: "
                              "place env on a device count that divides it")
        share = self.num_envs // ranks
        if share % self.same_start_group_size:
            raise ConfigError(f"{ranks} env workers of {share} envs would split same-start "
                              f"blocks: place env on a device count that keeps GRPO groups of "
                              f"{self.same_start_group_size} envs whole (num_envs="
                              f"{self.num_envs})")
        return replace(self, num_envs=share, processes=min(self.processes, share),
                       seed=self.seed + rank * share, first_env=self.first_env + rank * share)
