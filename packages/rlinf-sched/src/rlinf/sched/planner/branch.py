"""Exact branch and bound over range placements.

Components are placed one at a time (largest least work first), each on every allowed
contiguous range of the evaluator's device order in steps of `unit` devices (allowed: its
device constraints, at least one unit of its batch per device, and its memory fits the
range's least device memory alone, `Evaluator.fits_alone`). A partial placement's
bound is its busiest component, device or shared node's cores (`Evaluator.core_shares`),
counting compute only (`Evaluator.lower_bound` restricted to the components placed so far);
placing more components only adds load, so a
subtree whose bound reaches the `keep`-th best time found cannot contain a better plan and is
cut. Children are visited in bound order, so good plans come early. At a leaf every runnable
micro-batch combination (`Evaluator.options`) is tried, except those whose own bound
(`Evaluator.sized_bound`) cannot beat the threshold. The result is the same best `keep`
times as simulating everything. Plans are told apart by their device sets (`Scored.devices`),
so seeds from another device order count once.
"""

from __future__ import annotations

import itertools
import math
import time
from collections.abc import Iterable
from dataclasses import dataclass, field

from rlinf.sched.errors import PlanningError
from rlinf.sched.planner.space import BOUND_SLACK, CORE_SLACK, Candidate, Evaluator, Scored

__all__ = ["FIXED_MODES", "BranchResult", "branch_and_bound", "fixed_mode"]

FIXED_MODES = ("collocated", "disaggregated")
"""Modes `branch_and_bound` can be restricted to (see `fixed_mode`)."""


def fixed_mode(ev: Evaluator, candidate: Candidate) -> str | None:
    """``"collocated"`` when every component has the same range, of as many devices as they
    can all use (`Evaluator.fit`: every device unless the batch or `max_devices` caps it);
    ``"disaggregated"`` when the ranges are pairwise disjoint and cover every device, or each
    is as large as its component can use; None otherwise (hybrid, or devices left idle)."""
    n = ev.cluster.num_devices
    sizes = [e - s for s, e in candidate]
    if len(set(candidate)) == 1:
        return "collocated" if sizes[0] == ev.fit(range(len(candidate)), n) else None
    ordered = sorted(candidate)
    if all(a[1] <= b[0] for a, b in itertools.pairwise(ordered)) and (
            sum(sizes) == n or all(size == ev.fit([i], n) for i, size in enumerate(sizes))):
        return "disaggregated"
    return None


@dataclass
class BranchResult:
    """The best plans found and whether the search finished (so they are the optimum)."""

    top: list[Scored] = field(default_factory=list)
    """Best first, distinct device sets."""
    complete: bool = True
    """False when `max_leaves` stopped the search early."""
    leaves: int = 0
    """Placements scored (those not cut by the bound)."""


class _Top:
    """The `keep` best distinct placements, by (time, device sets)."""

    def __init__(self, keep: int, seeds: Iterable[Scored]) -> None:
        self.keep = keep
        self.items: list[Scored] = []
        for s in seeds:
            self.offer(s)

    def threshold(self) -> float:
        return self.items[-1].time if len(self.items) >= self.keep else math.inf

    def offer(self, scored: Scored) -> None:
        same = [s for s in self.items if s.devices == scored.devices]
        if same and same[0].time <= scored.time:
            return
        self.items = [s for s in self.items if s.devices != scored.devices]
        self.items.append(scored)
        self.items.sort(key=lambda s: (s.time, s.devices))
        del self.items[self.keep:]


def branch_and_bound(
    ev: Evaluator,
    *,
    unit: int = 1,
    keep: int = 5,
    mode: str | None = None,
    seeds: Iterable[Scored] = (),
    max_leaves: int | None = None,
    deadline: float | None = None,
) -> BranchResult:
    """The best `keep` range placements with their best micro-batches (module docstring).

    Args:
        mode: ``"collocated"`` or ``"disaggregated"`` placements only (`fixed_mode`: on
            every device the components can use); None for any placement.
        seeds: already scored candidates (e.g. from the heuristic search) to start from; they
            only tighten the threshold sooner.
        max_leaves: stop after scoring this many placements (`BranchResult.complete` is then
            False); None for no limit.
        deadline: stop once `time.perf_counter` reaches it (`BranchResult.complete` is
            then False); None for no limit.
    """
    n = ev.cluster.num_devices
    comps = ev.workflow.components
    if unit < 1 or n % unit:
        raise PlanningError(f"unit={unit} does not divide the {n} devices: expected a divisor")
    if mode is not None and mode not in FIXED_MODES:
        raise PlanningError(f"mode={mode!r}: expected one of {FIXED_MODES} or None")
    bounds = range(0, n + 1, unit)
    choices: list[list[tuple[float, int, int]]] = []
    for i, c in enumerate(comps):
        ranges = [(s, e) for s in bounds for e in bounds
                  if e > s and ev.can_run(i, e - s) and ev.fits_alone(i, s, e)]
        if mode == "collocated":  # the most devices every component can use
            common = ev.fit(range(len(comps)), n)
            ranges = [r for r in ranges if r == (0, common)]
        if not ranges:
            shared = " on the devices of every other" if mode == "collocated" else ""
            raise PlanningError(f"component {c.name!r} cannot be placed{shared} on {n} devices "
                                f"in units of {unit}: check its device_multiple/min_devices/"
                                f"max_devices, that its batch ({ev.workflow.batch_of(c.name)} "
                                "items) has a unit per device and that it fits device memory")
        choices.append(sorted((ev.work(c.name, ev.parallel(s, e)), s, e) for s, e in ranges))
    # Heaviest first: the bound grows fastest near the root.
    order = sorted(range(len(comps)), key=lambda i: -choices[i][0][0])
    top = _Top(keep, seeds)
    result = BranchResult()
    load = [0.0] * n
    used = [0] * n
    cores: dict[int, float] = {}  # per shared node: its cores' summed load (`core_shares`)
    placed: list[tuple[int, int]] = [(0, 0)] * len(comps)
    shave = 1 - BOUND_SLACK
    core_shave = 1 - CORE_SLACK

    def leaf() -> bool:
        cand: Candidate = tuple(placed)
        if mode is not None and fixed_mode(ev, cand) != mode:
            return True
        if (max_leaves is not None and result.leaves >= max_leaves) or (
                deadline is not None and time.perf_counter() >= deadline):
            result.complete = False
            return False
        result.leaves += 1
        limit = top.threshold()
        scored = ev.best(cand, exhaustive=True, below=limit)
        if scored is not None and scored.time <= limit:
            top.offer(scored)
        return True

    def visit(depth: int, bound: float) -> bool:
        if depth == len(order):
            return leaf()
        i = order[depth]
        children = []
        for work, s, e in choices[i]:
            if mode == "disaggregated" and any(used[s:e]):
                continue
            shares = ev.core_shares(s, e)
            node_bound = max((cores.get(node, 0.0) + work * share for node, share in shares),
                             default=0.0) * core_shave
            children.append((max(bound, work, max(load[s:e]) + work, node_bound),
                             work, s, e, shares))
        children.sort()
        for child_bound, work, s, e, shares in children:
            if child_bound * shave >= top.threshold():
                break
            placed[i] = (s, e)
            for d in range(s, e):
                load[d] += work
                used[d] += 1
            for node, share in shares:
                cores[node] = cores.get(node, 0.0) + work * share
            go_on = visit(depth + 1, child_bound)
            for d in range(s, e):
                load[d] -= work
                used[d] -= 1
            for node, share in shares:
                cores[node] -= work * share
            if not go_on:
                return False
        return True

    visit(0, 0.0)
    result.top = list(top.items)
    return result
