"""`RunSection`: the ``run`` keys of a config that every app shares.

An app's ``run`` section subclasses it, adding its own keys (its length, evaluation,
outputs) and overriding a default by declaring the field again; `RunSection.settings` turns
it into the runner's `RunSettings`. Nothing here imports torch or Ray: a config is checked
before any worker starts.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any, Literal

from rlinf.workers.errors import ConfigError, InvalidConfigError
from rlinf.workers.schema import Range

if TYPE_CHECKING:
    from rlinf.workers.training.task import RunSettings

__all__ = ["Logger", "RunSection"]

Logger = Literal["jsonl", "tensorboard", "wandb", "mlflow"]
"""Where metrics can go (`rlinf.workers.telemetry`)."""


@dataclass(frozen=True)
class RunSection:
    """Seed, outputs, checkpoints, restarts and the plan trials of a run."""

    seed: int = 0
    """Seed of sampling, initialisation and shuffling."""
    run_dir: str = "runs/run"
    """Folder for the config, metrics, checkpoints, plots, trace and summary."""
    checkpoint_every: Annotated[int, Range(0)] = 10
    """Save a checkpoint every this many iterations and after the last (0: only the last)."""
    keep_checkpoints: Annotated[int, Range(1)] = 2
    """Checkpoints kept in run_dir/checkpoints (older ones are pruned)."""
    eval_every: Annotated[int, Range(0)] = 10
    """Evaluate every this many iterations, besides before and after training (0: only
    before and after)."""
    trace: bool = False
    """Write a Chrome trace of every component's spans next to the planner's predicted one."""
    loggers: tuple[Logger, ...] = ("jsonl", "tensorboard")
    """Where metrics go: jsonl (metrics.jsonl, the run's record: always on), tensorboard,
    wandb (offline into run_dir/wandb without a wandb login; extra wandb) and mlflow (a
    local file store in run_dir/mlruns unless MLFLOW_TRACKING_URI; extra mlflow)."""
    max_restarts: Annotated[int, Range(0)] = 0
    """When a worker dies (killed, out of memory, its node lost), tear down what is left,
    relaunch from the last checkpoint (from the start before the first one) and go on, at
    most this many times; each restart is recorded in the metrics (``run/restarts``) and
    the summary. 0: the run stops and says to --resume."""
    profile_cache: str | None = "~/.cache/rlinf/profiles"
    """A folder of profiles shared by runs and sweep jobs, keyed by workflow, model,
    settings, cluster and host CPU: every run adds what it measured of itself, and a later
    run of the same setting is priced (and placement=auto planned) before it starts;
    without one, auto starts on a first guess and prices it live (null: no cache)."""
    trial_plans: Annotated[int, Range(0)] = 0
    """placement=auto with a cached profile: run at most this many of the plans priced
    within run.trial_margin of the best for run.trial_steps iterations each (throw-away
    flows before the real one) and launch the fastest as measured; 0 or 1: launch the
    best-priced plan untried."""
    trial_margin: Annotated[float, Range(0)] = 0.10
    """placement=auto: how close (relative) to the best price a plan must be to be tried."""
    trial_steps: Annotated[int, Range(2)] = 3
    """placement=auto: iterations per trial; the first is a warm-up, the median of the rest
    counts."""

    def __post_init__(self) -> None:
        if not self.run_dir:
            raise InvalidConfigError("run.run_dir", self.run_dir, "a non-empty path")
        if self.profile_cache is not None and not self.profile_cache.strip():
            # an empty path would keep profiles in whatever folder the run starts from
            raise InvalidConfigError("run.profile_cache", self.profile_cache,
                                     "a folder path, or null for no cache")

    def check_loggers(self) -> None:
        """jsonl kept, no logger twice, and each one's package installed (found, not
        imported); `InvalidConfigError` or `MissingExtraError` otherwise."""
        from rlinf.workers.telemetry.run_files import check_loggers

        try:
            check_loggers(self.loggers)
        except ConfigError as exc:
            raise InvalidConfigError("run.loggers", list(self.loggers),
                                     "a list holding jsonl (metrics.jsonl is the run's "
                                     "record: resume and the summary read it) and any of "
                                     "tensorboard, wandb, mlflow, each once") from exc

    def settings(self, *, steps: int, auto: bool, **more: Any) -> RunSettings:
        """The runner's settings of this section, for a run of `steps` iterations; `more`
        sets the runner's other fields (`RunSettings`)."""
        from rlinf.workers.training.task import RunSettings

        return RunSettings(
            run_dir=Path(self.run_dir).expanduser(), steps=steps,
            checkpoint_every=self.checkpoint_every, eval_every=self.eval_every,
            keep_checkpoints=self.keep_checkpoints, max_restarts=self.max_restarts,
            loggers=tuple(self.loggers), trace=self.trace, auto=auto,
            profile_cache=self.profile_cache, trial_plans=self.trial_plans,
            trial_margin=self.trial_margin, trial_steps=self.trial_steps, **more)
