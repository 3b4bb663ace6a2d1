"""The run folder: what a checkpoint records beside the flow's own state, and the checks a
start or ``--resume`` makes before anything launches.

A checkpoint's meta holds the iteration it was taken after, the flat config (to name the
differences when a resume is refused) and the overrides that made it, the evaluation of the
starting policy, the execution plan (a resumed ``auto`` run keeps its plan instead of
planning again), the training seconds and what the iterations produced so far.
"""

from __future__ import annotations

import json
from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from rlinf.sched import ExecutionPlan
from rlinf.workers.errors import ConfigError
from rlinf.workers.telemetry import CheckpointStore
from rlinf.workers.telemetry.checkpoints import META_FILE
from rlinf.workers.training.errors import CheckpointMismatchError, ResumeError

__all__ = ["CHECKPOINT_DIR", "EXPORT_FILE", "METRICS_FILE", "ResumePoint", "check_run_folder",
           "checkpoint_for_export", "checkpoint_meta", "config_differences",
           "find_resume_point", "write_export_record"]

CHECKPOINT_DIR = "checkpoints"
"""Folder of the checkpoints inside the run folder."""
METRICS_FILE = "metrics.jsonl"
"""The metrics of every iteration, one JSON object per line."""
EXPORT_FILE = "rlinf_export.json"
"""Written beside an exported model: which run and step it came from."""


@dataclass(frozen=True)
class ResumePoint:
    """A checkpoint to resume from."""

    step: int
    """Iterations completed when it was taken."""
    path: Path
    """Its folder (what the flow's ``load`` reads)."""
    plan: ExecutionPlan
    """The execution plan the run used."""
    seconds: float
    """Training wall time up to this checkpoint."""
    before: Mapping[str, float] = field(default_factory=dict)
    """The evaluation of the starting policy."""
    counted: int = 0
    """What the iterations produced up to this checkpoint (samples, env steps)."""


def checkpoint_meta(config: Mapping[str, Any], *, step: int, before: Mapping[str, float],
                    plan: ExecutionPlan, seconds: float, counted: int,
                    overrides: Sequence[str]) -> dict[str, Any]:
    """The meta stored with the checkpoint taken after `step`."""
    return {"step": step, "config": dict(config), "overrides": list(overrides),
            "before": dict(before), "plan": plan.to_dict(), "seconds": seconds,
            "counted": counted}


def config_differences(old: Mapping[str, Any], new: Mapping[str, Any], *,
                       defaults: Mapping[str, Any],
                       may_change: Collection[str]) -> tuple[str, ...]:
    """``"key: old -> new"`` for each flat key that differs, except those a resumed run may
    change, and those a checkpoint written before they existed lacks while `new` holds
    their default (such a run resumes after an upgrade)."""
    keys = sorted((set(old) | set(new)) - set(may_change))
    return tuple(f"{k}: {old.get(k)!r} -> {new.get(k)!r}" for k in keys
                 if old.get(k) != new.get(k)
                 and not (k not in old and k in defaults and new.get(k) == defaults[k]))


def find_resume_point(store: CheckpointStore, config: Mapping[str, Any], *,
                      defaults: Mapping[str, Any], may_change: Collection[str]) -> ResumePoint:
    """The latest checkpoint of `store`, checked against `config`.

    Raises:
        ResumeError: there is no checkpoint, or its meta is unreadable.
        CheckpointMismatchError: it was written with a config that differs in more than
            `may_change`.
    """
    found = store.latest()
    if found is None:
        raise ResumeError(f"--resume found no checkpoint in {store.root}: run without --resume "
                          "to start, or point --run-dir at the folder of the run to continue")
    _, path, meta = found
    old = meta.get("config")
    diffs = (config_differences(old, config, defaults=defaults, may_change=may_change)
             if isinstance(old, Mapping) else ("the checkpoint does not record its config",))
    if diffs:
        overrides = meta.get("overrides") or []
        hint = (f"it was started with the overrides {' '.join(overrides)}",) if overrides else ()
        raise CheckpointMismatchError(str(path), (*diffs, *hint),
                                      tuple(sorted(k for k in may_change if k in config)))
    try:
        return ResumePoint(step=int(meta["step"]), path=path,
                           plan=ExecutionPlan.from_dict(meta["plan"]),
                           seconds=float(meta.get("seconds", 0.0)),
                           before={k: float(v) for k, v in meta.get("before", {}).items()},
                           counted=int(meta.get("counted", 0)))
    except (KeyError, TypeError, ValueError, AttributeError) as exc:
        raise ResumeError(f"checkpoint {path} has unreadable meta ({exc!r}): it was not "
                          "written by this app; start a new run in another --run-dir") from exc


def check_run_folder(run_dir: Path, store: CheckpointStore, *, config: Mapping[str, Any],
                     defaults: Mapping[str, Any], may_change: Collection[str], steps: int,
                     resume: bool, restarting: bool = False, unit: str = "step",
                     length_key: str = "run.steps") -> ResumePoint | None:
    """Where a session starts: None for the beginning, else the checkpoint to resume from.

    A folder that holds a run is refused unless `resume`; a resume that has nothing left to
    do is refused too. A restart (`restarting`) before the first checkpoint starts over."""
    if restarting and store.latest() is None:
        return None  # died before the first checkpoint: start over (metrics are redone)
    if not resume:
        if (run_dir / METRICS_FILE).exists() or store.latest() is not None:
            raise ResumeError(f"run folder {run_dir} already holds a run: pass --resume to "
                              "continue it, or choose another --run-dir (nothing was "
                              "overwritten)")
        return None
    point = find_resume_point(store, config, defaults=defaults, may_change=may_change)
    if point.step >= steps:
        raise ResumeError(f"the latest checkpoint in {run_dir} is at {unit} {point.step}, and "
                          f"{length_key}={steps}: nothing to do; raise {length_key} to train "
                          "longer")
    return point


def checkpoint_for_export(run_dir: Path, step: int | None) -> tuple[int, Path, dict[str, Any]]:
    """The step, folder and meta of `run_dir`'s checkpoint at `step` (None: the latest), for
    an app's ``export``; a `ConfigError` says what is missing."""
    root = Path(run_dir) / CHECKPOINT_DIR
    steps = CheckpointStore(root).steps() if root.is_dir() else []
    if not steps:
        raise ConfigError(f"{run_dir} holds no complete checkpoint ({CHECKPOINT_DIR}/step-*): "
                          "pass the --run-dir of a run that saved one (run.checkpoint_every)")
    chosen = steps[-1] if step is None else next((s for s in steps if s[0] == step), None)
    if chosen is None:
        raise ConfigError(f"{root} has no checkpoint of step {step}; it has steps "
                          f"{[s for s, _ in steps]}")
    return chosen[0], chosen[1], json.loads((chosen[1] / META_FILE).read_text("utf-8"))


def write_export_record(out: Path, *, run_dir: Path, step: int, **extra: Any) -> None:
    """`EXPORT_FILE` in `out`: the run and step an export came from, and `extra`."""
    (out / EXPORT_FILE).write_text(json.dumps(
        {"run_dir": str(run_dir), "step": step, **extra}, indent=2) + "\n")
