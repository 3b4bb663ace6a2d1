"""What the runner asks of an app: its settings, its flow and its task hooks.

An app hands `rlinf.workers.training.train` a `TrainingTask`: the run's `RunSettings`
(length, cadences, folder, loggers, planning switches), how to plan (a fixed placement's
plan, ``auto``'s first guess, pricing a plan from a profile, ranking plans), how to launch
its flow, and what is its own: the evaluation, a step's metrics, what a checkpoint exports
and the summary's lines. Everything else (the run folder, resume, restarts, the
profile cache, live pricing and re-planning, checkpoints, metrics, progress, the trace) is
the runner's.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from types import TracebackType
from typing import TYPE_CHECKING, Any, Protocol, TextIO, TypeVar

from rlinf.sched import (
    Cluster,
    ExecutionPlan,
    PlanResult,
    Profile,
    SimulationResult,
)
from rlinf.workers.flow.run import FlowRun
from rlinf.workers.flow.trials import PlanTrial
from rlinf.workers.telemetry import Span
from rlinf.workers.training.plan_history import MeasuredPlan

if TYPE_CHECKING:
    from rlinf.workers.training.pricing import Pricing

__all__ = ["PlanChoice", "RunOutcome", "RunSettings", "StepOutcome", "TrainingFlow",
           "TrainingTask", "steady_median"]


@dataclass(frozen=True)
class RunSettings:
    """How long a run is, how often it evaluates and checkpoints, where it writes, and how
    it plans."""

    run_dir: Path
    """The run folder: config, metrics, checkpoints, profile, plan, summary."""
    steps: int
    """Training iterations to reach (over all sessions of a resumed run)."""
    checkpoint_every: int = 0
    """Checkpoint every this many iterations (0: only after the last)."""
    eval_every: int = 0
    """Evaluate every this many iterations (0: only before the first and after the last)."""
    keep_checkpoints: int = 2
    """Checkpoints kept (the newest)."""
    max_restarts: int = 0
    """Times a run restarts itself from its last checkpoint after a worker died."""
    loggers: tuple[str, ...] = ()
    """Trackers the metrics go to besides ``metrics.jsonl`` (`rlinf.workers.telemetry`)."""
    trace: bool = False
    """Record every component's spans: ``trace.json`` and the timeline."""
    auto: bool = False
    """Placement ``auto``: the planner chooses the plan."""
    predict: bool = True
    """Price a fixed placement's plan (from the profile cache, or the run's first steps)."""
    profile_cache: str | None = None
    """Folder of the profiles of earlier runs (None: no cache)."""
    replan: bool = False
    """Re-plan when the measured iteration drifts from the prediction (``auto`` only)."""
    replan_threshold: float = 0.25
    """Relative drift that counts (`rlinf.sched.DriftPolicy`)."""
    replan_patience: int = 3
    """Drifting iterations in a row before a re-plan."""
    trial_plans: int = 0
    """``auto`` with a profile: run at most this many of the plans priced within
    `trial_margin` of the best for `trial_steps` iterations each (throw-away flows) and
    launch the fastest as measured; 0 or 1: the best-priced plan, untried."""
    trial_margin: float = 0.10
    """How close to the best price (relative) a plan must be to be tried."""
    trial_steps: int = 3
    """Iterations per trial; the first is a warm-up, the median of the rest counts."""
    unit: str = "step"
    """What one iteration is called in the run's lines."""
    progress_desc: str = "train"
    """The progress bar's label."""
    progress_keys: tuple[str, ...] = ()
    """Metrics the progress bar shows."""


@dataclass(frozen=True)
class PlanChoice:
    """The plan a run launches, and how it was chosen."""

    plan: ExecutionPlan
    """The plan launched (``predicted_time`` set when a profile priced it)."""
    ranked: PlanResult | None = None
    """``auto``: the planner's ranked plans and fixed-mode baselines."""
    profile: Profile | None = None
    """The measured profile the prediction comes from."""
    simulation: SimulationResult | None = None
    """The simulated iteration of `plan` (with its intervals), when priced."""
    trials: tuple[PlanTrial, ...] = ()
    """``auto``'s trials of its closest-priced plans, if any ran."""
    live: bool = False
    """No profile priced the plan before the run: the run prices it from its own first
    steps and caches what it measured."""
    modeled: float | None = None
    """Seconds per iteration the model priced `plan` at before the run, from components
    measured elsewhere (None: not priced, or priced by what a run measured of it): the
    price the plan's measurement judges the model by (`plan_history.MeasuredPlan`)."""
    fallback: MeasuredPlan | None = None
    """``auto``: the fastest plan earlier runs measured, when `plan` is one no run has; the
    run goes back to it when `plan` measures slower (`plan_history`)."""


class StepOutcome(Protocol):
    """What a flow's iteration returns, as the runner reads it."""

    @property
    def metrics(self) -> Mapping[str, float]: ...
    @property
    def seconds(self) -> float: ...
    @property
    def spans(self) -> Sequence[Span]: ...
    @property
    def onloads(self) -> int: ...


class TrainingFlow(Protocol):
    """A launched flow as the runner drives it."""

    run: FlowRun

    def step(self, step: int, *, drain: bool = False) -> Any: ...
    def save(self, directory: Path) -> None: ...
    def load(self, directory: Path) -> None: ...
    def close(self, *, kill: bool = False) -> None: ...
    def __enter__(self) -> Any: ...
    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None: ...


FlowT = TypeVar("FlowT", bound=TrainingFlow)
SummaryT = TypeVar("SummaryT")


@dataclass(frozen=True)
class RunOutcome:
    """What a session trained, for the app's summary."""

    before: Mapping[str, float]
    """The evaluation of the starting policy (the first session's, kept in checkpoints)."""
    after: Mapping[str, float]
    """The last evaluation."""
    steps: int
    """Iterations completed, over all sessions."""
    wall_seconds: float
    """Training wall time of all sessions: iterations, evaluations, checkpoints."""
    total_seconds: float
    """This session's wall time from its start (launch and planning included)."""
    counted: int
    """What this session's iterations produced (`TrainingTask.record`'s count)."""
    counted_total: int
    """The same over all sessions."""
    step_seconds: tuple[float, ...]
    """Each iteration of this session."""
    plan_seconds: tuple[float, ...]
    """Each iteration of this session on the final plan (a relaunch starts it again)."""
    onloads: tuple[int, ...]
    """The device lock's onloads in each iteration of this session."""
    choice: PlanChoice
    """The final plan and how it was chosen."""
    restarts: tuple[str, ...]
    """One line per restart after a worker died."""

    @property
    def measured_iteration_s(self) -> float | None:
        """Median of the final plan's steady iterations (None without any)."""
        return steady_median(self.plan_seconds)

    @property
    def lock_switches_per_iteration(self) -> float | None:
        """Median onloads of this session's steady iterations (None without any)."""
        return steady_median([float(n) for n in self.onloads])

    @property
    def predicted_iteration_s(self) -> float | None:
        """The plan's priced iteration (None when no profile priced it)."""
        plan = self.choice.plan
        if self.choice.simulation is None or math.isnan(plan.predicted_time):
            return None
        return plan.predicted_time


def steady_median(values: Sequence[float]) -> float | None:
    """The median over steady iterations: all but the first (which pays for warm-up and
    first onloads) when there are several; None for no values."""
    steady = values[1:] if len(values) > 1 else values
    return float(statistics.median(steady)) if steady else None


class TrainingTask(Protocol[FlowT, SummaryT]):
    """An app's part of a run (module docstring)."""

    settings: RunSettings

    # -- configuration ------------------------------------------------------------------------
    def config(self) -> Mapping[str, Any]:
        """The run's config as a flat ``{dotted key: value}`` dict (JSON-friendly)."""
        ...

    def default_config(self) -> Mapping[str, Any]:
        """The defaults in the same form: a checkpoint written before a key existed resumes
        while the key holds its default."""
        ...

    resumable_keys: frozenset[str]
    """Keys a resumed run may change (its length, folder, loggers, restarts)."""

    def announce(self, out: TextIO) -> None:
        """Print what the run loaded (model, data, task), before the plan; once per run."""
        ...

    def ray_options(self) -> Mapping[str, Any]:
        """`rlinf.workers.flow.ensure_ray`'s options for a local Ray instance."""
        ...

    def cluster(self) -> Cluster:
        """The cluster the run plans for (discovered afresh each session)."""
        ...

    # -- planning -----------------------------------------------------------------------------
    @property
    def pricing(self) -> Pricing:
        """How the task's plans are priced and ranked as its flow runs them (its workflow
        is what the planner prices; the profile cache's key includes it)."""
        ...

    def profile_identity(self) -> Mapping[str, object]:
        """What a component's cost depends on besides the workflow and the cluster."""
        ...

    def fixed_plan(self, cluster: Cluster) -> ExecutionPlan:
        """The configured placement's plan, unpriced."""
        ...

    def first_guess(self, cluster: Cluster) -> ExecutionPlan:
        """``auto``'s plan when no profile prices any."""
        ...

    def compatible(self, current: ExecutionPlan, candidate: ExecutionPlan) -> bool:
        """Whether a checkpoint taken on `current` loads into a flow of `candidate` (a
        relaunch at an iteration boundary needs it)."""
        ...

    def profile(self, cluster: Cluster) -> Profile:
        """Probe runs that measure every component (a dry run of ``auto`` asked to plan
        before any run; a run itself never waits on them)."""
        ...

    # -- the run ------------------------------------------------------------------------------
    def launch(self, plan: ExecutionPlan, cluster: Cluster) -> FlowT:
        """The flow of `plan`, launched."""
        ...

    def evaluate(self, flow: FlowT, step: int, *, final: bool) -> Mapping[str, float]:
        """The evaluation's metrics after `step` iterations (0: the starting policy)."""
        ...

    def record(self, result: Any, *, counted: int) -> tuple[dict[str, float], int]:
        """An iteration's metrics and what it produced (samples, env steps); `counted` is
        what the run's iterations before it produced, over all sessions."""
        ...

    def checkpointed(self, step: int, path: Path) -> None:
        """Called after each checkpoint (an export, say)."""
        ...

    def write_outputs(self, records: Sequence[Mapping[str, float]], spans: Sequence[Span],
                      last_spans: Sequence[Span], choice: PlanChoice, *, out: TextIO) -> None:
        """The run's plots and trace from its metrics and spans."""
        ...

    def summarize(self, outcome: RunOutcome) -> SummaryT:
        """The summary: built, written to the run folder, returned."""
        ...

    def print_summary(self, summary: SummaryT, out: TextIO) -> None:
        """The closing lines (printed once the workers and Ray are gone)."""
        ...
