"""The M2Flow planner: temporal, spatial and hybrid placements × micro-batch granularity.

Every cluster is planned by a search that scales to thousands of devices (below). On small
clusters (at most `PlannerOptions.exact_devices` devices) exact branch and bound over every
range per component and every micro-batch combination follows, seeded with the search's
plans (`rlinf.sched.planner.branch`), for the plans and for each fixed-mode baseline; if it
scores more than `exact_limit` placements, or runs past `exact_seconds`, it stops and keeps
the best found so far. `search_seconds` bounds the whole search: past it, only the best
seed and each fixed mode's first plan are still scored, unrefined, and no exact pass starts.

Ranges are taken over each device order of `rlinf.sched.planner.orders` in turn (on a mixed
cluster, orders that group equal devices, so a component may get ``0-1,6-7``; on a
homogeneous one only the cluster's own order), and only micro-batch sizes the runtime runs
are proposed (`rlinf.sched.granularity`: declared multiples, divisors and shared sizes, and
at least one unit of the batch per device).

1. **Layouts.** Each component goes to one device block or spans every block; blocks are
   labelled in order of first use, so ``(0, 0, 0)`` is collocated, ``(0, 1, 2)`` fully
   disaggregated and ``(0, 1, span)`` the hybrid ``env: block 0, rollout: block 1, actor: all``.
2. **Coarse sizes.** Devices are counted in units (``N / coarse_units``); every composition of
   the units into the layout's blocks is a candidate. Candidates are visited in lower-bound
   order (busiest component or device, compute only) and scored with uniform micro-batch
   splits; the visit stops once the bound cannot beat the seeds kept so far.
3. **Fine sizes.** The best seeds (always including the best collocated and disaggregated
   ones) hill-climb by moving devices between blocks, halving the step down to `min_step`.
4. **Granularity.** The refined seeds get a per-component micro-batch search (every
   combination when few, else coordinate descent); all simulations are memoised.

The fixed-mode baselines are among the candidates, so the chosen plan is never slower than
the best collocated or the best disaggregated plan the planner priced.
"""

from __future__ import annotations

import itertools
import math
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, replace

import structlog

from rlinf.sched.cluster import Cluster
from rlinf.sched.costs import CostModel
from rlinf.sched.errors import PlanningError
from rlinf.sched.execution_plan import ExecutionPlan, PlanResult
from rlinf.sched.model_parallel import annotate_cuts
from rlinf.sched.planner.branch import FIXED_MODES, branch_and_bound, fixed_mode
from rlinf.sched.planner.orders import device_orders
from rlinf.sched.planner.progress import PROGRESS_EVERY_S, ProgressCallback, Ticker
from rlinf.sched.planner.space import Candidate, Evaluator, Scored
from rlinf.sched.workflow import Workflow

__all__ = ["SPAN", "BlockLayout", "PlannerOptions", "block_layouts", "plan"]

_log = structlog.get_logger(__name__)

SPAN = -1
"""Layout label of a component that spans every block."""


@dataclass(frozen=True)
class PlannerOptions:
    """Knobs of `plan` (defaults plan 1024 devices in seconds)."""

    max_chunks: int = 16
    """Most micro-batches a component's batch is split into (1, 2, 4, … up to this)."""
    coarse_units: int = 8
    """Units the devices are grouped into for the coarse pass (twice as many for layouts of
    up to two blocks; at least one per block)."""
    seeds: int = 8
    """Coarse candidates refined (plus the best collocated and disaggregated ones)."""
    keep: int = 5
    """Plans returned (best first)."""
    exact_devices: int = 16
    """On clusters of at most this many devices, follow the search with exact branch and bound
    over every range placement (`rlinf.sched.planner.branch`)."""
    exact_limit: int = 3000
    """Most placements branch and bound scores (per search) before it stops and keeps the
    best found so far; 0 turns it off."""
    exact_seconds: float | None = None
    """Seconds the exact pass may take in all, after which it stops and keeps the best found
    so far (the plan's log then says ``exact=False``); None: only `exact_limit` bounds it.
    A caller sets it from what the plan is worth: a short run on shared CPU slots cannot
    spend what a long run on GPUs can."""
    min_step: int | None = None
    """Finest block-size step in devices; None means ``max(1, N // 256)``."""
    idle_devices: bool = True
    """Also consider leaving a block of devices idle."""
    reorder_devices: bool = True
    """Also search device orders that group equal devices (`rlinf.sched.planner.orders`), so
    a component may get a non-contiguous set on a mixed cluster; no cost on a uniform one."""
    search_seconds: float | None = None
    """Seconds the whole search may take (None: no bound). Past them the coarse pass scores
    only a first candidate of each fixed mode it has none of yet, refinement keeps to the
    best seed and the fixed modes' (those refined first), and the exact pass does not
    start: the plans found so far are ranked (the log says ``complete=False``)."""
    progress_every: float = PROGRESS_EVERY_S
    """Seconds between two calls of `plan`'s `progress`."""
    tie_tolerance: float = 0.0
    """Plans predicted within this fraction of the fastest count as equally fast, and among
    them the one occupying fewest device slots ranks first. 0 (the default) ranks by
    predicted time alone, so the best plan is never predicted slower than another; an app
    whose profiles are noisier than that sets it, since a device that buys nothing the
    profile can resolve only adds processes that contend (on a loaded 2-core box an actor
    on two CPU slots, predicted marginally faster, ran far slower)."""

    def __post_init__(self) -> None:
        counts = {"max_chunks": self.max_chunks, "coarse_units": self.coarse_units,
                  "seeds": self.seeds, "keep": self.keep}
        for name, value in counts.items():
            if value < 1:
                raise PlanningError(f"PlannerOptions.{name}={value}: expected at least 1")
        for name, value in {"exact_devices": self.exact_devices,
                            "exact_limit": self.exact_limit}.items():
            if value < 0:
                raise PlanningError(f"PlannerOptions.{name}={value}: expected 0 (off) or more")
        if self.min_step is not None and self.min_step < 1:
            raise PlanningError(f"PlannerOptions.min_step={self.min_step}: expected None "
                                "(N // 256) or at least 1 device")
        seconds = {"exact_seconds": self.exact_seconds, "search_seconds": self.search_seconds,
                   "progress_every": self.progress_every, "tie_tolerance": self.tie_tolerance}
        for name, amount in seconds.items():
            if amount is not None and not amount >= 0:  # NaN too
                raise PlanningError(f"PlannerOptions.{name}={amount}: expected a number >= 0"
                                    + (" or None (no bound)" if name.endswith("_seconds")
                                       and name != "progress_every" else ""))


@dataclass(frozen=True)
class BlockLayout:
    """Which contiguous run of blocks each component occupies."""

    ranges: tuple[tuple[int, int], ...]
    """Per component: blocks ``[first, stop)`` it runs on."""
    blocks: int
    """Blocks in all, including an idle last block when present."""


def block_layouts(num_components: int, *, idle: bool = True,
                  interval_blocks: int | None = None) -> list[BlockLayout]:
    """Every layout: each component on one block (labelled 0, 1, … in order of first use) or
    SPAN over all of them, optionally one more block only spanning components use, optionally
    an idle last block (fewer devices can be faster when collectives grow with the device
    count). With up to `interval_blocks` blocks (default 3 for at most three components, else
    none), also every assignment of contiguous block runs (nested and partial overlaps).

    SPAN needs at least two blocks (on one block it is just that block).
    """
    labellings: list[tuple[int, ...]] = []

    def grow(prefix: tuple[int, ...], used: int) -> None:
        if len(prefix) == num_components:
            if used >= 1:
                labellings.append(prefix)
            return
        for label in (*range(used), used, SPAN):
            grow((*prefix, label), max(used, label + 1))

    grow((), 0)
    out: dict[BlockLayout, None] = {}
    idles = (0, 1) if idle else (0,)
    for labels in labellings:
        used = max(labels) + 1
        spans = SPAN in labels
        for extra in ((0, 1) if spans else (0,)):
            covered = used + extra
            if spans and covered < 2:
                continue
            ranges = tuple((0, covered) if lb == SPAN else (lb, lb + 1) for lb in labels)
            for idle_block in idles:
                out[BlockLayout(ranges, covered + idle_block)] = None
    if interval_blocks is None:
        interval_blocks = 3 if num_components <= 3 else 0
    for blocks in range(2, interval_blocks + 1):
        runs = [(lo, hi) for lo in range(blocks) for hi in range(lo + 1, blocks + 1)]
        for ranges in itertools.product(runs, repeat=num_components):
            if set().union(*(range(lo, hi) for lo, hi in ranges)) == set(range(blocks)):
                out.setdefault(BlockLayout(ranges, blocks), None)
    return list(out)


def _compositions(total: int, parts: int) -> Iterator[tuple[int, ...]]:
    for cuts in itertools.combinations(range(1, total), parts - 1):
        edges = (0, *cuts, total)
        yield tuple(b - a for a, b in itertools.pairwise(edges))


def _candidate(ev: Evaluator, layout: BlockLayout, sizes: Sequence[int]) -> Candidate:
    """The ranges of `layout` with blocks of `sizes` devices. Components that share a run of
    blocks keep its first devices only when it is more than they can all use (one unit of
    their batch per device, `max_devices`): a batch of 8 items takes 8 of a 64-device block."""
    starts = [0]
    for s in sizes:
        starts.append(starts[-1] + s)
    out = [(starts[lo], starts[hi]) for lo, hi in layout.ranges]
    for run in set(layout.ranges):
        members = [i for i, r in enumerate(layout.ranges) if r == run]
        start, stop = out[members[0]]
        if stop - start > min(ev.most_devices(i) for i in members):
            fit = ev.fit(members, stop - start)
            if fit:
                for i in members:
                    out[i] = (start, start + fit)
    return tuple(out)


def _largest_divisor(n: int, at_most: int) -> int:
    return max(d for d in range(1, min(n, at_most) + 1) if n % d == 0)


def plan(
    workflow: Workflow,
    cost: CostModel,
    cluster: Cluster,
    *,
    options: PlannerOptions | None = None,
    progress: ProgressCallback | None = None,
) -> PlanResult:
    """Choose how to run `workflow` on `cluster` (see the module docstring); `progress` is
    called every few seconds of a long search (`rlinf.sched.planner.progress`).

    Raises:
        PlanningError: no placement fits (memory, divisibility constraints).
    """
    opts = options or PlannerOptions()
    started = time.perf_counter()
    first = Evaluator(workflow, cost, cluster, max_chunks=opts.max_chunks,
                      ticker=Ticker(progress, every=opts.progress_every))
    evaluators = [first.reordered(order)
                  for order in device_orders(cluster, reorder=opts.reorder_devices)]
    n = cluster.num_devices
    scored: list[Scored] = []
    baselines: dict[str, Scored] = {}
    cutoff = None if opts.search_seconds is None else started + opts.search_seconds
    for ev in evaluators:
        found, fixed = _heuristic(ev, opts, cutoff=cutoff)
        scored += found
        _keep_best(baselines, fixed)
    exact = False
    complete = cutoff is None or time.perf_counter() < cutoff
    if n <= opts.exact_devices and opts.exact_limit > 0 and complete:
        exact = True
        first.ticker.phase = "exact"
        deadline = (None if opts.exact_seconds is None
                    else time.perf_counter() + opts.exact_seconds)
        if cutoff is not None:
            deadline = cutoff if deadline is None else min(deadline, cutoff)
        for k, ev in enumerate(evaluators):
            # Collocated is one candidate, the same in every order: searched once.
            modes = FIXED_MODES if k == 0 else tuple(m for m in FIXED_MODES
                                                     if m != "collocated")
            scored, fixed, complete = _exact(ev, opts, scored, baselines, modes=modes,
                                             deadline=deadline)
            _keep_best(baselines, fixed)
            exact = exact and complete
    if not scored:
        raise PlanningError(f"no placement of {list(workflow.names)} fits on {n} devices: "
                            "every candidate exceeds device memory or the parallelism limits")
    plans: list[ExecutionPlan] = []
    seen: set[tuple[tuple[int, ...], ...]] = set()
    fastest = min(s.time for s in scored)

    def rank(s: Scored) -> tuple[float, int, float, tuple[tuple[int, ...], ...]]:
        near = s.time <= fastest * (1.0 + opts.tie_tolerance)
        slots = sum(len(d) for d in s.devices) if near else 0
        return (0.0 if near else s.time, slots, s.time, s.devices)

    for s in sorted(scored, key=rank):
        if s.devices not in seen:
            seen.add(s.devices)
            plans.append(first.to_plan(s))
    base_plans = {k: first.to_plan(s, label=k) for k, s in baselines.items()}
    seconds = time.perf_counter() - started
    _log.info("plan", workflow=workflow.name, devices=n, best=plans[0].spec,
              time=round(plans[0].predicted_time, 4), simulations=first.simulations,
              orders=len(evaluators), exact=exact, complete=complete and (
                  cutoff is None or time.perf_counter() < cutoff), seconds=round(seconds, 3))
    result = PlanResult(tuple(plans[: opts.keep]), base_plans, first.simulations, seconds)
    return annotate_cuts(result, workflow, cost)


def _keep_best(baselines: dict[str, Scored], found: dict[str, Scored]) -> None:
    """Keep in `baselines` the faster plan of each fixed mode."""
    for kind, s in found.items():
        if kind not in baselines or (s.time, s.devices) < (baselines[kind].time,
                                                           baselines[kind].devices):
            baselines[kind] = s


def _exact(ev: Evaluator, opts: PlannerOptions, scored: list[Scored],
           baselines: dict[str, Scored], *, modes: Sequence[str] = FIXED_MODES,
           deadline: float | None = None,
           ) -> tuple[list[Scored], dict[str, Scored], bool]:
    """Branch and bound from the heuristic's plans, for the plans and for each fixed mode
    of `modes`; True when every search finished within `exact_limit` leaves and before
    `deadline` (the plans are optimal in `ev`'s device order)."""
    try:
        found = branch_and_bound(ev, keep=opts.keep, seeds=scored, max_leaves=opts.exact_limit,
                                 deadline=deadline)
    except PlanningError:  # some component fits no range of this order
        return scored, dict(baselines), True
    exact = found.complete
    out = dict(baselines)
    for kind in modes:
        seeds = [baselines[kind]] if kind in baselines else []
        try:
            fixed = branch_and_bound(ev, keep=1, mode=kind, seeds=seeds,
                                     max_leaves=opts.exact_limit, deadline=deadline)
        except PlanningError:  # the mode cannot place every component
            continue
        exact = exact and fixed.complete
        if fixed.top:
            out[kind] = fixed.top[0]
    return found.top + list(out.values()), out, exact


@dataclass(frozen=True)
class _Seed:
    time: float
    candidate: Candidate
    layout: BlockLayout
    sizes: tuple[int, ...]
    chunks: tuple[int, ...]
    unit: int


def _heuristic(ev: Evaluator, opts: PlannerOptions, *, cutoff: float | None = None
               ) -> tuple[list[Scored], dict[str, Scored]]:
    """Steps 1-4 of the module docstring, cut short at `cutoff` (`perf_counter` seconds;
    `PlannerOptions.search_seconds`)."""

    def past() -> bool:
        return cutoff is not None and time.perf_counter() >= cutoff

    n = ev.cluster.num_devices
    min_step = opts.min_step or max(1, n // 256)
    coarse: list[tuple[float, Candidate, BlockLayout, tuple[int, ...], int]] = []
    for layout in block_layouts(len(ev.names), idle=opts.idle_devices):
        blocks = layout.blocks
        units = _largest_divisor(n, max(opts.coarse_units * (2 if blocks <= 2 else 1), blocks))
        if units < blocks:
            continue
        unit = n // units
        for parts in _compositions(units, blocks):
            sizes = tuple(p * unit for p in parts)
            cand = _candidate(ev, layout, sizes)
            if ev.allowed(cand):
                coarse.append((ev.lower_bound(cand), cand, layout, sizes, unit))
    coarse.sort(key=lambda c: (c[0], c[1]))
    # Best coarse seed per layout; candidates come in bound order, so once the bound reaches
    # the `seeds`-th best layout and every fixed-mode layout's best, nothing later can enter.
    per_layout: dict[BlockLayout, _Seed] = {}
    best_fixed: dict[str, _Seed] = {}
    threshold = math.inf
    for bound, cand, layout, sizes, unit in coarse:
        kind = fixed_mode(ev, cand)
        if past() and (kind is None or kind in best_fixed):
            continue  # out of time: only a first plan of each fixed mode still
        fixed_done = all(k in best_fixed and bound >= best_fixed[k].time
                         for k in ("collocated", "disaggregated"))
        if bound >= threshold and fixed_done:
            break
        mine = per_layout.get(layout)
        if mine is not None and bound >= mine.time:
            continue
        if bound >= threshold and (kind is None or (kind in best_fixed
                                                    and bound >= best_fixed[kind].time)):
            continue
        t, chunks = ev.coarse(cand)
        if not math.isfinite(t):
            continue
        seed = _Seed(t, cand, layout, sizes, chunks, unit)
        if mine is None or t < mine.time:
            per_layout[layout] = seed
            times = sorted(s.time for s in per_layout.values())
            threshold = times[opts.seeds - 1] if len(times) >= opts.seeds else math.inf
        if kind is not None and (kind not in best_fixed or t < best_fixed[kind].time):
            best_fixed[kind] = seed
    seeds = sorted(per_layout.values(), key=lambda e: (e.time, e.candidate))[: opts.seeds]
    # The best seed and the fixed modes' first: a search cut short still has them.
    pool = {e.candidate: e for e in (*seeds[:1], *best_fixed.values(), *seeds[1:])}
    must = {e.candidate for e in (*seeds[:1], *best_fixed.values())}
    scored: list[Scored] = []
    baselines: dict[str, Scored] = {}
    for seed in pool.values():
        if past() and seed.candidate not in must:
            continue
        t, chunks = ev.quick(seed.candidate)
        cand = seed.candidate if past() else _refine(
            ev, replace(seed, time=t, chunks=chunks), min_step=min_step)
        best = ev.best(cand)
        if best is None:
            continue
        scored.append(best)
        kind = fixed_mode(ev, cand)
        if kind is not None and (kind not in baselines or best.time < baselines[kind].time):
            baselines[kind] = best
    return scored, baselines


def _moves(blocks: int, step: int) -> list[tuple[int, ...]]:
    """Size changes per block: `step` devices from one block to another, and (for even steps)
    from one block to two others or from two blocks to a third, half each."""
    out: list[tuple[int, ...]] = []
    for i, j in itertools.permutations(range(blocks), 2):
        delta = [0] * blocks
        delta[i], delta[j] = -step, step
        out.append(tuple(delta))
    if step >= 2 and step % 2 == 0:
        half = step // 2
        for i in range(blocks):
            for j, k in itertools.combinations([b for b in range(blocks) if b != i], 2):
                for sign in (1, -1):
                    delta = [0] * blocks
                    delta[i], delta[j], delta[k] = -sign * step, sign * half, sign * half
                    out.append(tuple(delta))
    return out


def _refine(ev: Evaluator, seed: _Seed, *, min_step: int) -> Candidate:
    """Hill-climb block sizes with `_moves` while they help, halving the step from one
    coarse unit down to `min_step`."""
    layout, chunks = seed.layout, seed.chunks
    current = list(seed.sizes)
    best_t = seed.time
    blocks = len(current)
    step = seed.unit
    while blocks > 1 and step >= min_step:
        improved = True
        while improved:
            improved = False
            for delta in _moves(blocks, step):
                trial = [size + d for size, d in zip(current, delta, strict=True)]
                if min(trial) < 1:
                    continue
                cand = _candidate(ev, layout, trial)
                if not ev.allowed(cand) or ev.lower_bound(cand) >= best_t:
                    continue
                t = ev.time(cand, ev.conform(cand, chunks))
                if t < best_t - 1e-12:
                    current, best_t, improved = trial, t, True
                    break
        if step == 1:
            break
        step //= 2
    return _candidate(ev, layout, current)
