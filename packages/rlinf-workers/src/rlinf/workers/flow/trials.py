"""Plan trials: ``auto`` runs the plans priced closest to its best for a few steps each, and
keeps the fastest as measured.

The planner ranks plans by a simulation fitted to a short profile. Where two plans are
priced within that profile's error of each other (on a shared 2-core machine the same plan's
iteration time varied widely across runs), the ranking between them is a coin toss
that a few real steps settle. Trials cost a launch and a few steps per plan, paid once
before a run of hundreds or thousands of steps; the run then takes the best shortlisted plan
as this cluster runs it, not as the simulation predicted it.

`shortlist` picks the plans worth trying, `try_plans` measures each with a callable the
caller supplies (it launches the plan, runs its steps and closes it; the trial's training
is thrown away), and `fastest` keeps the plan with the lowest median step.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TextIO

import structlog

from rlinf.sched import ExecutionPlan
from rlinf.workers.errors import ConfigError

__all__ = ["PlanTrial", "fastest", "format_trials", "run_trials", "shortlist", "try_plans"]

_log = structlog.get_logger(__name__)


@dataclass(frozen=True)
class PlanTrial:
    """One plan's trial: its steps' seconds after the warm-up."""

    plan: ExecutionPlan
    """The plan tried, priced (``predicted_time``)."""
    step_seconds: tuple[float, ...]
    """Wall seconds of each measured step (the warm-up steps left out)."""

    @property
    def seconds(self) -> float:
        """Median seconds per step."""
        return statistics.median(self.step_seconds)

    def to_dict(self) -> dict[str, object]:
        """What a run records of the trial (its summary)."""
        return {"plan": self.plan.spec, "mode": self.plan.mode.value,
                "granularity": dict(self.plan.granularity),
                "predicted_s": self.plan.predicted_time, "measured_s": self.seconds,
                "step_seconds": list(self.step_seconds)}


def shortlist(ranked: Sequence[ExecutionPlan], *, limit: int,
              margin: float) -> tuple[ExecutionPlan, ...]:
    """The plans of `ranked` priced within `margin` (relative) of the fastest, at most
    `limit`, fastest first; one plan when no other comes that close (nothing to try).

    A plan the simulation cannot tell from one already picked (same mode, same message
    sizes, same price: e.g. a light component moved to another device of the same set) is
    left out, so the trials compare alternatives rather than copies of the best."""
    if limit < 1:
        raise ConfigError(f"a trial shortlist needs room for >= 1 plan, got limit={limit}")
    if not margin >= 0:
        raise ConfigError(f"the trial margin must be >= 0, got {margin}")
    if not ranked:
        raise ConfigError("no plans to shortlist")
    ordered = sorted(ranked, key=lambda p: p.predicted_time)
    bound = ordered[0].predicted_time * (1.0 + margin)
    picked: list[ExecutionPlan] = []
    for plan in ordered:
        if plan.predicted_time > bound or len(picked) == limit:
            break
        if not any(_indistinguishable(plan, other) for other in picked):
            picked.append(plan)
    return tuple(picked)


def _indistinguishable(a: ExecutionPlan, b: ExecutionPlan) -> bool:
    """Whether the simulation priced `a` and `b` as the same execution."""
    return (a.mode is b.mode and dict(a.granularity) == dict(b.granularity)
            and math.isclose(a.predicted_time, b.predicted_time, rel_tol=1e-9))


def try_plans(plans: Sequence[ExecutionPlan],
              measure: Callable[[ExecutionPlan], Sequence[float]], *,
              warmup: int = 1) -> tuple[PlanTrial, ...]:
    """Each plan's trial: ``measure(plan)`` runs it and returns its steps' seconds, of
    which the first `warmup` are left out (start-up effects: first allocations, caches)."""
    if warmup < 0:
        raise ConfigError(f"warmup must be >= 0, got {warmup}")
    trials = []
    for plan in plans:
        seconds = tuple(float(s) for s in measure(plan))
        if len(seconds) <= warmup:
            raise ConfigError(f"a trial of {plan.spec!r} ran {len(seconds)} step(s); it needs "
                              f"more than the {warmup} warm-up step(s) to measure one")
        trial = PlanTrial(plan=plan, step_seconds=seconds[warmup:])
        _log.info("plan_tried", plan=plan.spec, predicted_s=plan.predicted_time,
                  measured_s=trial.seconds)
        trials.append(trial)
    return tuple(trials)


def fastest(trials: Sequence[PlanTrial]) -> PlanTrial:
    """The trial with the lowest median step (a tie goes to the earlier, better-priced)."""
    if not trials:
        raise ConfigError("no trials to choose from")
    return min(trials, key=lambda t: t.seconds)


def format_trials(trials: Sequence[PlanTrial], chosen: PlanTrial) -> str:
    """One line per trial, measured and predicted seconds and the placement, the chosen
    one starred (what an app prints before it launches)."""
    return "\n".join(f" {'*' if trial is chosen else ' '} {trial.seconds:8.3f} s measured, "
                     f"{trial.plan.predicted_time:8.3f} s predicted  {trial.plan.spec}"
                     for trial in trials)


def run_trials(ranked: Sequence[ExecutionPlan],
               measure: Callable[[ExecutionPlan], Sequence[float]], *, limit: int,
               margin: float, steps: int, unit: str, out: TextIO) -> tuple[PlanTrial, ...]:
    """An app's trials: the `shortlist` of `ranked`, announced on `out`, each plan measured
    (`try_plans`: `measure` runs it for `steps` `unit`) and the results printed with the
    fastest starred; ``()`` when fewer than two plans are priced close enough to compare."""
    picked = shortlist(ranked, limit=limit, margin=margin)
    if len(picked) < 2:
        return ()
    print(f"auto: {len(picked)} plans priced within {margin:.0%} of the best; running each "
          f"for {steps} {unit} ...", file=out, flush=True)
    trials = try_plans(picked, measure)
    print(format_trials(trials, fastest(trials)), file=out)
    return trials
