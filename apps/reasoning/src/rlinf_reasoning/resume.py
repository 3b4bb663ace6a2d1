"""What a checkpoint records beside the flow's own state, and the checks ``--resume`` makes.

A checkpoint's `meta` holds the step it was taken after, the data position (batches
consumed; step k consumes batch k - 1, so position = step), the config hash and the flat
config itself (to name the differences when a resume is refused), the overrides that made
it, the held-out accuracy before training, the execution plan the run used (so a resumed
``auto`` run keeps its plan instead of re-profiling) and the training seconds so far.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from rlinf.sched import ExecutionPlan
from rlinf.workers.telemetry import CheckpointStore
from rlinf_reasoning.config import ReasoningConfig, config_dict, config_differences, config_hash
from rlinf_reasoning.errors import CheckpointMismatchError, ResumeError

__all__ = ["CHECKPOINT_DIR", "Checkpoint", "checkpoint_meta", "find_resume_point"]

CHECKPOINT_DIR = "checkpoints"
"""Folder of the checkpoints inside the run folder."""


@dataclass(frozen=True)
class Checkpoint:
    """A checkpoint to resume from."""

    step: int
    """Steps completed when it was taken."""
    path: Path
    """Its folder (what `ReasoningFlow.load` reads)."""
    data_position: int
    """Training batches consumed."""
    heldout_before: float
    """Held-out greedy accuracy of the starting model."""
    plan: ExecutionPlan
    """The execution plan the run used."""
    seconds: float
    """Training wall time up to this checkpoint."""


def checkpoint_meta(
    cfg: ReasoningConfig, *, step: int, heldout_before: float, plan: ExecutionPlan,
    seconds: float, overrides: Sequence[str],
) -> dict[str, Any]:
    """The `meta` stored with the checkpoint taken after `step`."""
    return {
        "step": step,
        "data_position": step,
        "config_hash": config_hash(cfg),
        "config": config_dict(cfg),
        "overrides": list(overrides),
        "heldout_before": heldout_before,
        "plan": plan.to_dict(),
        "seconds": seconds,
    }


def _differences(old: Mapping[str, Any], cfg: ReasoningConfig) -> tuple[str, ...]:
    """`config_differences`, less the keys a checkpoint written before they existed lacks
    while `cfg` holds their default: such a run resumes after an upgrade."""
    new, defaults = config_dict(cfg), config_dict(ReasoningConfig())
    added = {k for k in new if k not in old and new[k] == defaults.get(k)}
    return config_differences(dict(old),
                              {k: v for k, v in new.items() if k not in added})


def find_resume_point(store: CheckpointStore, cfg: ReasoningConfig) -> Checkpoint:
    """The latest checkpoint of `store`, checked against `cfg`.

    Raises:
        ResumeError: there is no checkpoint, or it is unreadable.
        CheckpointMismatchError: it was written with a config that differs in anything but
            ``run.steps`` (and the run folder's path).
    """
    found = store.latest()
    if found is None:
        raise ResumeError(f"--resume found no checkpoint in {store.root}: run without --resume "
                          "to start, or point --run-dir at the folder of the run to continue")
    _, path, meta = found
    if meta.get("config_hash") != config_hash(cfg):
        old = meta.get("config")
        diffs = (_differences(old, cfg) if isinstance(old, Mapping)
                 else ("the checkpoint does not record its config",))
    else:
        diffs = ()
    if diffs:
        overrides = meta.get("overrides") or []
        hint = (f"it was started with the overrides {' '.join(overrides)}",) if overrides else ()
        raise CheckpointMismatchError(str(path), (*diffs, *hint))
    try:
        return Checkpoint(
            step=int(meta["step"]), path=path, data_position=int(meta["data_position"]),
            heldout_before=float(meta["heldout_before"]),
            plan=ExecutionPlan.from_dict(meta["plan"]), seconds=float(meta.get("seconds", 0.0)),
        )
    except (KeyError, TypeError, ValueError) as exc:
        raise ResumeError(f"checkpoint {path} has unreadable meta ({exc}): it was not written "
                          "by rlinf-reasoning; start a new run in another --run-dir") from exc
