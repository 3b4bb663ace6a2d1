"""Re-planning during a run: compare measured with predicted, re-fit, re-plan on drift.

RLinf's scheduler plans once, offline. Workloads drift while they train — responses grow
longer, a node slows down — and the plan chosen from the first profile stops being the
best one. `Replanner` watches every iteration:

1. `observe` takes the iteration's measured seconds and, per component, either the
   measured calls (`Call`: items, devices, seconds) or its busy seconds in the iteration.
2. Each component gets a *live correction*: the median of measured / predicted seconds
   under the base cost model (per call, or busy seconds against the simulated
   iteration's) over the drifting iterations — the run as it is now, not as it was
   before the drift. `LiveCostModel` prices the workflow with the base model's curves
   times these factors, so the shape of each fit (fixed and per-device terms) is kept and
   its level follows the run.
3. When the measured iteration time differs from the plan's prediction by more than
   `threshold` (relative) for `patience` consecutive iterations, the planner runs again on
   the corrected costs. The new plan is adopted when the corrected model predicts it at
   least `min_gain` faster than the current plan (re-priced on the same corrected model);
   otherwise the current plan's prediction is refreshed, so the same drift does not fire
   again at every iteration.

The caller switches plans at an iteration boundary (after its checkpoint, so a re-plan is
checkpoint-consistent) and logs the returned `Replan` in its metrics and trace.
"""

from __future__ import annotations

import statistics
from collections import deque
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import structlog

from rlinf.sched.cluster import Cluster
from rlinf.sched.costs import CostModel
from rlinf.sched.errors import PlanningError
from rlinf.sched.execution_plan import ExecutionPlan, PlanResult
from rlinf.sched.simulator import SimulationResult, simulate
from rlinf.sched.workflow import Workflow

__all__ = ["Call", "DriftPolicy", "LiveCostModel", "Replan", "Replanner", "switch_pays"]

_log = structlog.get_logger(__name__)


@dataclass(frozen=True)
class DriftPolicy:
    """When the runtime re-plans."""

    threshold: float = 0.15
    """Relative deviation of measured from predicted iteration seconds that counts as drift."""
    patience: int = 3
    """Consecutive drifting iterations before re-planning (one slow iteration is noise)."""
    min_gain: float = 0.05
    """A new plan must be predicted this much faster (relative) than the current one."""
    window: int = 16
    """Most recent iterations whose measured/predicted call ratios are kept."""

    def __post_init__(self) -> None:
        if not self.threshold > 0:
            raise PlanningError(f"DriftPolicy.threshold={self.threshold}: expected > 0")
        if self.patience < 1 or self.window < 1:
            raise PlanningError(f"DriftPolicy.patience={self.patience}, window={self.window}: "
                                "expected both >= 1")
        if not 0 <= self.min_gain < 1:
            raise PlanningError(f"DriftPolicy.min_gain={self.min_gain}: expected in [0, 1)")


def switch_pays(current_s: float, candidate_s: float, *, steps_left: int, switch_s: float,
                min_gain: float = 0.05) -> bool:
    """Whether moving a run to another plan at an iteration boundary pays: the other plan is
    (predicted or measured) at least `min_gain` faster per iteration, relative, and that
    saving over the `steps_left` iterations exceeds `switch_s`, the seconds the switch
    costs (a checkpoint and a relaunch: the processes start again)."""
    if not (current_s > 0 and candidate_s > 0 and steps_left > 0):
        return False
    saving = current_s - candidate_s
    return saving >= min_gain * current_s and saving * steps_left > max(switch_s, 0.0)


@dataclass(frozen=True)
class Call:
    """One measured call of a component."""

    items: int
    num_devices: int
    seconds: float


@dataclass(frozen=True)
class Replan:
    """A re-planning decision, for metrics and the trace."""

    iteration: int
    measured: float
    """Median measured seconds per iteration over the drifting iterations."""
    predicted_before: float
    """What the current plan was predicted to take when it was chosen."""
    repriced_current: float
    """The current plan re-priced on the corrected costs."""
    predicted_new: float
    """The chosen plan's prediction on the corrected costs."""
    adopted: bool
    """Whether the plan changed (False: the current plan stays, prediction refreshed)."""
    plan: ExecutionPlan
    """The plan to run from the next iteration on."""
    corrections: Mapping[str, float] = field(default_factory=dict)
    """Per component: measured / predicted seconds applied to the base costs."""

    def to_dict(self) -> dict[str, Any]:
        """A JSON-friendly record."""
        return {"iteration": self.iteration, "measured": self.measured,
                "predicted_before": self.predicted_before,
                "repriced_current": self.repriced_current,
                "predicted_new": self.predicted_new, "adopted": self.adopted,
                "spec": self.plan.spec, "micro_batch": dict(self.plan.micro_batch),
                "corrections": dict(self.corrections)}


class LiveCostModel:
    """A `CostModel` whose times are the base model's scaled per component."""

    def __init__(self, base: CostModel, corrections: Mapping[str, float]) -> None:
        self.base = base
        self.corrections = dict(corrections)

    def time(self, component: str, *, batch_size: int, num_devices: int) -> float:
        """Base time × the component's live correction (1 when none)."""
        return (self.base.time(component, batch_size=batch_size, num_devices=num_devices)
                * self.corrections.get(component, 1.0))

    def memory(self, component: str, *, batch_size: int, num_devices: int) -> int:
        """The base model's memory."""
        return self.base.memory(component, batch_size=batch_size, num_devices=num_devices)

    def switch_time(self, component: str) -> float:
        """The base model's switch time."""
        return self.base.switch_time(component)


Planner = Callable[[Workflow, CostModel, Cluster], PlanResult]
Pricer = Callable[[ExecutionPlan, CostModel], SimulationResult]


class Replanner:
    """Watches a run and re-plans when it drifts (see the module docstring).

    Args:
        workflow, cluster: what the plan is for.
        plan: the plan the run starts with.
        cost: the cost model the plan was chosen on (the profile's fit).
        planner: ``(workflow, cost, cluster) -> PlanResult``; `rlinf.sched.plan` with the
            run's options, restricted as the runtime needs (e.g. a fixed device count).
        price: ``(plan, cost) -> SimulationResult``, the simulation of a plan as the
            runtime executes it; default `simulate` with the plan's micro-batches.
        policy: thresholds.
    """

    def __init__(self, workflow: Workflow, cluster: Cluster, plan: ExecutionPlan,
                 cost: CostModel, *, planner: Planner, price: Pricer | None = None,
                 policy: DriftPolicy | None = None) -> None:
        self.workflow = workflow
        self.cluster = cluster
        self.plan = plan
        self.base = cost
        self.planner = planner
        self.price: Pricer = price or (lambda p, c: simulate(
            workflow, p.placement, c, cluster, micro_batch=p.micro_batch))
        self._base_busy: Mapping[str, float] | None = None
        self.policy = policy or DriftPolicy()
        self.predicted = plan.predicted_time
        self._ratios: deque[dict[str, list[float]]] = deque(maxlen=self.policy.window)
        self._drifting: list[float] = []
        self.history: list[Replan] = []

    def corrections(self, iterations: int | None = None) -> dict[str, float]:
        """Per component: median measured / predicted seconds of its calls in the last
        `iterations` observed iterations (default: the whole window)."""
        recent = list(self._ratios)[-iterations:] if iterations else list(self._ratios)
        merged: dict[str, list[float]] = {}
        for ratios in recent:
            for name, values in ratios.items():
                merged.setdefault(name, []).extend(values)
        return {n: statistics.median(v) for n, v in merged.items() if v}

    def observe(self, iteration: int, *, seconds: float,
                calls: Mapping[str, Sequence[Call]] | None = None,
                busy: Mapping[str, float] | None = None) -> Replan | None:
        """Record one iteration; returns a `Replan` when this iteration triggered one.

        Pass each component's measured `calls`, or its `busy` seconds in the iteration
        (compared with the simulated busy seconds of the current plan).
        """
        if not seconds > 0:
            raise PlanningError(f"iteration {iteration} took {seconds!r} s: expected > 0")
        ratios: dict[str, list[float]] = {}
        for name, spent in (busy or {}).items():
            if name not in self.workflow.names:
                raise PlanningError(f"busy seconds of {name!r}, which is not a component of "
                                    f"the workflow: expected one of {list(self.workflow.names)}")
            if self._base_busy is None:
                self._base_busy = self.price(self.plan, self.base).busy_seconds
            expected = self._base_busy.get(name, 0.0)
            if expected > 0 and spent >= 0:
                ratios[name] = [spent / expected]
        for name, measured in (calls or {}).items():
            if name not in self.workflow.names:
                raise PlanningError(f"measured calls of {name!r}, which is not a component of "
                                    f"the workflow: expected one of {list(self.workflow.names)}")
            for call in measured:
                expected = self.base.time(name, batch_size=call.items,
                                          num_devices=call.num_devices)
                if expected > 0 and call.seconds >= 0:
                    ratios.setdefault(name, []).append(call.seconds / expected)
        self._ratios.append(ratios)
        deviation = abs(seconds - self.predicted) / self.predicted if self.predicted > 0 else 0
        if deviation <= self.policy.threshold:
            self._drifting.clear()
            return None
        self._drifting.append(seconds)
        if len(self._drifting) < self.policy.patience:
            return None
        return self._replan(iteration)

    def _replan(self, iteration: int) -> Replan:
        corrections = self.corrections(len(self._drifting))
        live = LiveCostModel(self.base, corrections)
        current = self.price(self.plan, live).iteration_time
        best = self.planner(self.workflow, live, self.cluster).best
        adopted = best.predicted_time < current * (1 - self.policy.min_gain)
        measured = statistics.median(self._drifting)
        chosen = best if adopted else self.plan
        decision = Replan(iteration, measured, self.predicted, current, best.predicted_time,
                          adopted, chosen, corrections)
        _log.info("replan", iteration=iteration, measured=round(measured, 4),
                  predicted_before=round(self.predicted, 4), repriced=round(current, 4),
                  predicted_new=round(best.predicted_time, 4), adopted=adopted,
                  spec=chosen.spec)
        if adopted:
            self._base_busy = None
        self.plan = chosen
        self.predicted = best.predicted_time if adopted else current
        self._drifting.clear()
        self.history.append(decision)
        return decision
