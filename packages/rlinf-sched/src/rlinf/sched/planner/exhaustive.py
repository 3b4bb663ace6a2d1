"""Exhaustive planning for small clusters: every range per component, every micro-batch.

Every component may take any contiguous range of devices (in steps of `unit` devices) in
each of the planner's device orders (`rlinf.sched.planner.orders`: on a mixed cluster, also
the non-contiguous sets that group equal devices), so collocated, disaggregated (with every
split), partially overlapping and hybrid placements, and placements that leave devices idle,
are all enumerated; each with every combination of runnable micro-batch sizes from the
candidate set (`Evaluator.options`). With ``prune=True`` (the default) this is the exact
branch and bound of `rlinf.sched.planner.branch` (same best `keep` times, a tiny fraction of
the simulations; simulations are shared between candidates with one signature, across
orders too). ``prune=False`` simulates every candidate with every micro-batch combination.
"""

from __future__ import annotations

import itertools
import math
import time

import structlog

from rlinf.sched.cluster import Cluster
from rlinf.sched.costs import CostModel
from rlinf.sched.errors import PlanningError
from rlinf.sched.execution_plan import PlanResult
from rlinf.sched.model_parallel import annotate_cuts
from rlinf.sched.planner.branch import branch_and_bound
from rlinf.sched.planner.orders import device_orders
from rlinf.sched.planner.space import Candidate, Evaluator, Scored
from rlinf.sched.workflow import Workflow

__all__ = ["exhaustive_candidates", "exhaustive_search"]

_log = structlog.get_logger(__name__)


def exhaustive_candidates(evaluator: Evaluator, *, unit: int = 1) -> list[Candidate]:
    """All range candidates (multiples of `unit`) of the evaluator's device order that meet
    the components' constraints (`Evaluator.can_run`) and fit their memory alone
    (`Evaluator.fits_alone`; the others never simulate)."""
    n = evaluator.cluster.num_devices
    if unit < 1 or n % unit:
        raise PlanningError(f"unit={unit} does not divide the {n} devices: expected a divisor")
    bounds = range(0, n + 1, unit)
    ranges = [(s, e) for s in bounds for e in bounds if e > s]
    per_comp = [[r for r in ranges
                 if evaluator.can_run(i, r[1] - r[0]) and evaluator.fits_alone(i, *r)]
                for i in range(len(evaluator.workflow.components))]
    for c, rs in zip(evaluator.workflow.components, per_comp, strict=True):
        if not rs:
            raise PlanningError(f"component {c.name!r} cannot be placed on {n} devices in units "
                                f"of {unit}: check its device_multiple/min_devices/max_devices, "
                                "its batch and its memory")
    return [tuple(c) for c in itertools.product(*per_comp)]


def exhaustive_search(
    workflow: Workflow,
    cost: CostModel,
    cluster: Cluster,
    *,
    unit: int = 1,
    max_chunks: int = 16,
    keep: int = 5,
    prune: bool = True,
    max_candidates: int = 200_000,
    reorder_devices: bool = True,
) -> PlanResult:
    """The best `keep` plans over the whole range × micro-batch space (see module docstring).

    Args:
        reorder_devices: also search the device orders that group equal devices
            (`rlinf.sched.planner.orders`); False keeps the cluster's own order only.

    Raises:
        PlanningError: the search would score more than `max_candidates` placements in one
            device order (all of them without pruning), or nothing fits.
    """
    started = time.perf_counter()
    first = Evaluator(workflow, cost, cluster, max_chunks=max_chunks)
    top: list[Scored] = []
    visited = 0
    refused: list[PlanningError] = []
    orders = device_orders(cluster, reorder=reorder_devices)
    # Regrouped orders first: on a mixed cluster they hold the plans that fit memory best,
    # whose times then cut the cluster's own order early (seeds only tighten the bound).
    for order in reversed(orders):
        ev = first.reordered(order)
        try:
            cands = [] if prune else exhaustive_candidates(ev, unit=unit)
        except PlanningError as exc:  # some component fits no range of this order
            refused.append(exc)
            continue
        if prune:
            try:
                found = branch_and_bound(ev, unit=unit, keep=keep, seeds=top,
                                         max_leaves=max_candidates)
            except PlanningError as exc:
                refused.append(exc)
                continue
            if not found.complete:
                raise PlanningError(f"exhaustive search scored {max_candidates} placements "
                                    "without finishing: raise max_candidates, use a larger "
                                    "unit or plan()")
            top, visited = found.top, visited + found.leaves
            continue
        if len(cands) > max_candidates:
            raise PlanningError(f"exhaustive search over {len(cands)} placements exceeds "
                                f"max_candidates={max_candidates}: use a larger unit or plan()")
        for cand in cands:
            scored = ev.best(cand, exhaustive=True)
            if scored is None or any(s.devices == scored.devices for s in top):
                continue
            top.append(scored)
            top.sort(key=lambda s: (s.time, s.devices))
            del top[keep:]
        visited += len(cands)
    if len(refused) == len(orders):  # no order can place some component
        raise refused[0]
    if not top:
        raise PlanningError(f"no placement of {list(workflow.names)} fits on "
                            f"{cluster.num_devices} devices: every candidate exceeds memory")
    plans = tuple(first.to_plan(s) for s in top)
    seconds = time.perf_counter() - started
    _log.debug("exhaustive_search", candidates=visited, simulations=first.simulations,
               best=plans[0].predicted_time, seconds=round(seconds, 3))
    return annotate_cuts(PlanResult(plans, {}, first.simulations, seconds), workflow, cost)


def best_time(result: PlanResult) -> float:
    """Predicted time of the best plan (inf for an empty result)."""
    return result.best.predicted_time if result.ranked else math.inf
