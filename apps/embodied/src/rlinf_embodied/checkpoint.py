"""Checkpoints of an `EmbodiedFlow`: the actor (model, optimizer, shuffling generator, step,
global RNGs), every policy process's sampling streams and, unless the spec resets every
iteration, every env worker's simulator state (`rlinf.workers.env.state`), so that a loaded
flow continues the same trajectory."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

import torch

from rlinf.workers.errors import ConfigError
from rlinf.workers.runtime import PER_RANK_ALL

if TYPE_CHECKING:
    from rlinf_embodied.flow import EmbodiedFlow

__all__ = ["FORMAT", "load_flow", "save_flow"]

FORMAT = "rlinf-embodied-flow/2"
"""Version 2: env state and (inline) policy state are lists, one per env worker."""


def save_flow(flow: EmbodiedFlow, directory: Path) -> None:
    """Write ``actor.pt``, ``policy.pt`` (each policy process's, or each env worker's inline
    policy) and ``env.pt`` (the format, the grouping and every env worker's state) under
    `directory`."""
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    env = flow.group("env")
    torch.save(flow.group("actor").call("state")[0], directory / "actor.pt")
    policy = env.call("policy_state") if flow.inline else flow.group("rollout").call("state")
    torch.save(policy, directory / "policy.pt")
    env_state = (None if flow.spec.reset_every_iteration
                 else [rank["env"] for rank in env.call("state")])
    torch.save({"format": FORMAT, "env": env_state, "stages": flow.stages,
                "inline": flow.inline, "env_workers": env.world_size}, directory / "env.pt")


def load_flow(flow: EmbodiedFlow, directory: Path) -> None:
    """Restore what `save_flow` wrote into `flow` (same spec; any placement with the same
    stage groups, env workers and policy processes), then sync the weights."""
    directory = Path(directory)
    try:
        meta = torch.load(directory / "env.pt", weights_only=False)
        actor = torch.load(directory / "actor.pt", weights_only=False)
        policy_state = torch.load(directory / "policy.pt", weights_only=False)
    except FileNotFoundError as exc:
        raise ConfigError(f"{directory} is not an embodied flow checkpoint (missing "
                          f"{Path(exc.filename or '').name}): pass a directory written by "
                          "EmbodiedFlow.save") from exc
    if meta.get("format") != FORMAT:
        raise ConfigError(f"{directory} holds format {meta.get('format')!r}, expected "
                          f"{FORMAT!r}")
    if meta["stages"] != flow.stages:
        raise ConfigError(f"the checkpoint ran {meta['stages']} stage groups, this flow "
                          f"{flow.stages}: sampling differs by grouping; use the same plan "
                          "micro-batch")
    env_group = flow.group("env")
    policy_group = env_group if flow.inline else flow.group("rollout")
    if meta["env_workers"] != env_group.world_size or len(policy_state) != (
            policy_group.world_size):
        raise ConfigError(f"the checkpoint ran {meta['env_workers']} env workers and "
                          f"{len(policy_state)} policy processes, this flow "
                          f"{env_group.world_size} and {policy_group.world_size}: place env "
                          "and rollout on as many devices as the checkpointed run")
    env_state = meta["env"]
    if env_state is None and not flow.spec.reset_every_iteration:
        raise ConfigError(f"{directory} has no env state (saved with "
                          "reset_every_iteration=True) but this spec continues episodes")
    flow.group("actor").call("load_state", actor)
    envs = env_state or [None] * env_group.world_size
    if flow.inline:
        env_group.call("load_state", [{"env": e, "policy": p}
                                      for e, p in zip(envs, policy_state, strict=True)],
                       spec=PER_RANK_ALL)
    else:
        env_group.call("load_state", [{"env": e, "policy": None} for e in envs],
                       spec=PER_RANK_ALL)
        policy_group.call("load_state", policy_state, spec=PER_RANK_ALL)
    flow.run.sync_weights()
