"""What earlier runs of a setting measured of the plans they ran, and ``auto``'s prices
corrected by it.

The planner prices a plan from its components' costs. On shared CPU cores it misses what
running them side by side costs beyond dividing the cores (cache and memory-bandwidth
contention, more processes and hops), and a plan it has not seen run can measure well
over its price. Every run therefore records, in the cached profile, the plan it ran with
the median seconds per iteration it measured and, when the model priced it before it ran,
that price (`MeasuredPlan`). ``auto``'s next ranking (`calibrated`):

- prices a plan an earlier run measured at what it measured;
- prices every other plan at the model's price times the model's worst error so far,
  measured over the plans it priced before they ran (`model_error`);
- names the fastest plan measured before as the run's fallback, which the run goes back
  to when the plan it tries measures slower (`rlinf.workers.training.planning.kept_faster`).

So ``auto`` tries a plan only while the model, corrected by its own record, still prices
it faster than the best that has run, and it never stays on a plan slower than one it
has measured.
"""

from __future__ import annotations

import dataclasses
import json
import math
import statistics
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from rlinf.sched import ExecutionPlan, PlanningError, PlanResult, Profile

__all__ = ["MEASURED_PLANS", "Calibrated", "MeasuredPlan", "calibrated", "measured_plans",
           "merge_measured", "model_error", "plan_key", "with_measured"]

MEASURED_PLANS = "measured_plans"
"""Profile metadata key: `plan_key` → `MeasuredPlan.to_dict`, the newest run of each plan."""
KEEP = 32
"""Plans a profile remembers (the newest runs')."""
RUNS_KEPT = 5
"""Runs of one plan a record keeps (the newest)."""


def plan_key(plan: ExecutionPlan) -> str:
    """What makes two plans the same run: placement, micro-batches, message sizes, cuts."""
    return json.dumps([plan.spec, sorted(plan.micro_batch.items()),
                       sorted(plan.granularity.items()),
                       sorted((k, sorted(v.items())) for k, v in plan.parallelism.items())])


@dataclass(frozen=True)
class MeasuredPlan:
    """A plan as runs measured it."""

    plan: ExecutionPlan
    runs: tuple[float, ...]
    """Each run's median seconds per iteration on the plan, past its first (warm-up)
    iteration; the newest `RUNS_KEPT`, oldest first."""
    modeled: float | None = None
    """Seconds per iteration the model priced it at before it first ran (None: priced from
    its own iterations, not a prediction of the model)."""

    def __post_init__(self) -> None:
        object.__setattr__(self, "runs", tuple(float(r) for r in self.runs))
        for value in (*self.runs, *(() if self.modeled is None else (self.modeled,))):
            if not (math.isfinite(value) and value > 0):
                raise ValueError(f"MeasuredPlan of {self.plan.spec}: seconds {value!r}, "
                                 "expected > 0")
        if not self.runs:
            raise ValueError(f"MeasuredPlan of {self.plan.spec}: no run, expected one")

    @property
    def seconds(self) -> float:
        """The median over its runs (one run on a shared machine can be a slow spell)."""
        return float(statistics.median(self.runs))

    @property
    def error(self) -> float | None:
        """Measured over modeled seconds (None when not modeled)."""
        return None if self.modeled is None else self.seconds / self.modeled

    def and_then(self, later: MeasuredPlan) -> MeasuredPlan:
        """This record with a `later` run of the same plan."""
        return MeasuredPlan(later.plan, (*self.runs, *later.runs)[-RUNS_KEPT:],
                            self.modeled if self.modeled is not None else later.modeled)

    def to_dict(self) -> dict[str, Any]:
        return {"plan": self.plan.to_dict(), "runs": list(self.runs), "modeled": self.modeled}

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> MeasuredPlan:
        modeled = data.get("modeled")
        return cls(ExecutionPlan.from_dict(data["plan"]), tuple(data["runs"]),
                   None if modeled is None else float(modeled))


def measured_plans(profile: Profile) -> dict[str, MeasuredPlan]:
    """The plans `profile` records as measured, by `plan_key`; an entry that does not read
    (written by another version) is skipped."""
    out: dict[str, MeasuredPlan] = {}
    for key, data in dict(profile.metadata.get(MEASURED_PLANS) or {}).items():
        try:
            out[str(key)] = MeasuredPlan.from_dict(data)
        except (KeyError, TypeError, ValueError, PlanningError):
            continue
    return out


def merge_measured(old: Mapping[str, Any] | None, new: Mapping[str, Any] | None
                   ) -> dict[str, Any]:
    """`MEASURED_PLANS` metadata of two profiles: `new`'s entries over `old`'s, the newest
    `KEEP` (a run's `with_measured` already holds the runs before it)."""
    merged = {k: v for k, v in (old or {}).items() if k not in (new or {})}
    merged.update(new or {})
    return dict(list(merged.items())[-KEEP:])


def with_measured(profile: Profile, measured: MeasuredPlan) -> Profile:
    """`profile` recording `measured` (after the runs of the same plan it records)."""
    key = plan_key(measured.plan)
    before = measured_plans(profile).get(key)
    entry = {key: (measured if before is None else before.and_then(measured)).to_dict()}
    metadata = {**profile.metadata,
                MEASURED_PLANS: merge_measured(profile.metadata.get(MEASURED_PLANS), entry)}
    return Profile(profile.measurements, profile.switches, metadata)


def model_error(history: Mapping[str, MeasuredPlan]) -> float:
    """How far the model priced under what runs measured, at worst: the largest measured
    over modeled seconds of the plans it priced before they ran, at least 1 (a plan that
    ran faster than priced says nothing of the others)."""
    return max([1.0, *(m.error for m in history.values() if m.error is not None)])


@dataclass(frozen=True)
class Calibrated:
    """``auto``'s ranking corrected by the plans earlier runs measured."""

    result: PlanResult
    """The plans by corrected price (``predicted_time``), fastest first: those measured
    before at their measured seconds, the others at the model's price times `error`."""
    error: float
    """The model's worst error so far (`model_error`)."""
    measured: frozenset[str]
    """`plan_key` of every ranked plan priced by what a run measured."""
    fallback: MeasuredPlan | None
    """The fastest plan measured before, when the best plan is one no run measured."""


def calibrated(result: PlanResult, history: Mapping[str, MeasuredPlan],
               price: Callable[[ExecutionPlan], ExecutionPlan]) -> Calibrated:
    """`result` re-ranked with `history` (module docstring). `price` prices a measured plan
    that the planner's ranking left out (the plan as the task launches it)."""
    error = model_error(history)

    def corrected(plan: ExecutionPlan) -> ExecutionPlan:
        known = history.get(plan_key(plan))
        return dataclasses.replace(plan, predicted_time=known.seconds if known is not None
                                   else plan.predicted_time * error)

    candidates: dict[str, ExecutionPlan] = {}
    for plan in result.ranked:
        candidates.setdefault(plan_key(plan), corrected(plan))
    for key, known in history.items():
        if key in candidates:
            continue
        try:
            candidates[key] = dataclasses.replace(price(known.plan), predicted_time=known.seconds)
        except PlanningError:  # no longer a plan of this workflow: its record stays unused
            continue
    ranked = tuple(sorted(candidates.values(), key=lambda p: p.predicted_time))
    measured = frozenset(k for k in candidates if k in history)
    fallback = None
    if measured and plan_key(ranked[0]) not in measured:
        plan = next(p for p in ranked if plan_key(p) in measured)
        fallback = dataclasses.replace(history[plan_key(plan)], plan=plan)
    baselines = {name: corrected(plan) for name, plan in result.baselines.items()}
    return Calibrated(dataclasses.replace(result, ranked=ranked, baselines=baselines), error,
                      measured, fallback)
