"""The training run of every app: resume → plan → launch → iterations with evaluation,
checkpoints and metrics → summary, with self-healing restarts and Ctrl-C handling.

An app writes a `TrainingTask` (its settings, how to plan and launch its flow, its
evaluation, metrics and summary) and calls `train(task)`; `runner` runs it, `planning`
chooses, prices and changes its plan without delaying its start (the profile cache, live
pricing, ``auto``'s live switch, re-planning), `folder` checks the run folder and reads the
checkpoint to resume from. Names are imported from their module on first use
(`rlinf.workers._lazy`): an app's config and errors import this package without Ray.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from rlinf.workers._lazy import lazy_attribute

if TYPE_CHECKING:
    from rlinf.workers.training.errors import CheckpointMismatchError, ResumeError
    from rlinf.workers.training.folder import (
        CHECKPOINT_DIR,
        METRICS_FILE,
        ResumePoint,
        check_run_folder,
        checkpoint_meta,
        find_resume_point,
    )
    from rlinf.workers.training.planning import (
        PLAN_FILE,
        PROFILE_FILE,
        choose_plan,
        collocated_devices,
        describe_plan,
        dry_run,
        format_plans,
        profile_cache,
        profile_identity,
    )
    from rlinf.workers.training.pricing import Pricing, ProfileCosts
    from rlinf.workers.training.runner import train
    from rlinf.workers.training.task import (
        PlanChoice,
        RunOutcome,
        RunSettings,
        StepOutcome,
        TrainingFlow,
        TrainingTask,
        steady_median,
    )

_LAZY = {
    "CheckpointMismatchError": "errors",
    "ResumeError": "errors",
    "CHECKPOINT_DIR": "folder",
    "METRICS_FILE": "folder",
    "ResumePoint": "folder",
    "check_run_folder": "folder",
    "checkpoint_meta": "folder",
    "find_resume_point": "folder",
    "PLAN_FILE": "planning",
    "PROFILE_FILE": "planning",
    "Pricing": "pricing",
    "ProfileCosts": "pricing",
    "choose_plan": "planning",
    "collocated_devices": "planning",
    "describe_plan": "planning",
    "dry_run": "planning",
    "format_plans": "planning",
    "profile_cache": "planning",
    "profile_identity": "planning",
    "train": "runner",
    "PlanChoice": "task",
    "RunOutcome": "task",
    "RunSettings": "task",
    "StepOutcome": "task",
    "TrainingFlow": "task",
    "TrainingTask": "task",
    "steady_median": "task",
}


def __getattr__(name: str) -> Any:
    return lazy_attribute(__name__, _LAZY, name)


__all__ = [
    "CHECKPOINT_DIR",
    "METRICS_FILE",
    "PLAN_FILE",
    "PROFILE_FILE",
    "CheckpointMismatchError",
    "PlanChoice",
    "Pricing",
    "ProfileCosts",
    "ResumeError",
    "ResumePoint",
    "RunOutcome",
    "RunSettings",
    "StepOutcome",
    "TrainingFlow",
    "TrainingTask",
    "check_run_folder",
    "checkpoint_meta",
    "choose_plan",
    "collocated_devices",
    "describe_plan",
    "dry_run",
    "find_resume_point",
    "format_plans",
    "profile_cache",
    "profile_identity",
    "steady_median",
    "train",
]
