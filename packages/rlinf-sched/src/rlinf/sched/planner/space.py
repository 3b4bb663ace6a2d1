"""The search space and the scorer shared by the exhaustive and the heuristic planner.

A candidate placement gives every component one contiguous range ``[start, stop)`` of
positions in the evaluator's device order (`rlinf.sched.planner.orders`; in the cluster's own
order the positions are the device indices): collocated, all the same range; disaggregated,
disjoint ranges; hybrid, anything else, e.g. ``env: 0-3, rollout: 4-7, actor: 0-7``. A
component gets at most one device per unit of its batch (`rlinf.sched.granularity`), and its
micro-batch candidates are the sizes its runtime runs on that many devices. `Evaluator`
scores a candidate by simulation, picks its best micro-batches, memoises everything, and
gives a cheap lower bound used for pruning.

Simulations are memoised by the candidate's *signature*: the device count of each component,
the set of distinct atoms (which components share a device group, and its device memory),
which components sit on the same node and, on several nodes whose CPU slots share their
cores, how each range splits over the nodes. A simulation reads nothing else of the placement,
so candidates with one signature (e.g. translations of a layout inside a node) share one
simulation, exactly. Evaluators of one planning run over different device orders share
these caches (`Evaluator.reordered`).
"""

from __future__ import annotations

import copy
import itertools
import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import structlog

from rlinf.sched.cluster import Cluster
from rlinf.sched.core_sharing import CoreSharing
from rlinf.sched.costs import CostModel
from rlinf.sched.errors import PlanningError
from rlinf.sched.execution_plan import ExecutionPlan
from rlinf.sched.granularity import micro_batch_choices, runnable_sizes, smallest_call
from rlinf.sched.placement import ComponentPlacement, Placement, derive_mode
from rlinf.sched.planner.progress import Ticker
from rlinf.sched.simulator import CachedCostModel, Layout, SimulationResult, simulate_layout
from rlinf.sched.workflow import Workflow

__all__ = ["Candidate", "Evaluator", "Scored", "Signature", "chunk_choices"]

_log = structlog.get_logger(__name__)

Candidate = tuple[tuple[int, int], ...]
"""One ``(start, stop)`` range of device-order positions per component, in `Workflow.names`
order."""

Signature = tuple[tuple[int, ...], frozenset[tuple[int, int]], tuple[int, ...],
                  tuple[tuple[tuple[int, int], ...], ...]]
"""What a simulation reads of a candidate: device counts, atoms as (component bit mask,
device memory), per component the first component on its node (-1: spans nodes), and on
several nodes whose CPU slots share cores, per component its (node, slots) split."""


def chunk_choices(workflow: Workflow, *, max_chunks: int) -> dict[str, tuple[int, ...]]:
    """Candidate micro-batch sizes per component, devices aside: the runnable sizes nearest
    the batch split into 1, 2, 4, … chunks (`rlinf.sched.granularity.micro_batch_choices`)."""
    return {c.name: micro_batch_choices(workflow, c.name, max_chunks=max_chunks)
            for c in workflow.components}


@dataclass(frozen=True)
class Scored:
    """A candidate with its best micro-batches and simulated time."""

    candidate: Candidate
    micro_batch: Mapping[str, int]
    time: float
    result: SimulationResult
    devices: tuple[tuple[int, ...], ...] = field(default=())
    """Per component (names order) its device indices: the candidate mapped through the
    evaluator's device order. Identifies the placement across orders."""


class _Shared:
    """What the evaluators of one planning run share, whatever their device order."""

    def __init__(self, ticker: Ticker | None) -> None:
        self.ticker = ticker or Ticker(None)
        self.by_signature: dict[tuple[Signature, tuple[int, ...]], SimulationResult | None] = {}
        self.work: dict[tuple[str, int, int], float] = {}
        self.sizes: dict[tuple[int, int], tuple[int, ...]] = {}
        self.least_memory: dict[tuple[int, int], int] = {}
        self.memo: dict[Any, Any] = {}
        self.best: dict[Signature, tuple[float, float, tuple[int, ...] | None]] = {}
        """Per signature, an exhaustive `Evaluator.best`: (its `below`, best time, sizes)."""


class Evaluator:
    """Scores candidates: memoised simulation, micro-batch search and lower bounds."""

    def __init__(self, workflow: Workflow, cost: CostModel, cluster: Cluster, *,
                 max_chunks: int = 16, enumerate_limit: int = 256,
                 order: Sequence[int] | None = None, ticker: Ticker | None = None) -> None:
        self.workflow = workflow
        self.cost = cost if isinstance(cost, CachedCostModel) else CachedCostModel(cost)
        self.cluster = cluster
        self._sharing = CoreSharing.of(cluster)
        self.names = workflow.names
        self.choices = chunk_choices(workflow, max_chunks=max_chunks)
        self.enumerate_limit = enumerate_limit
        self._shared = _Shared(ticker)
        self._sim: dict[tuple[Candidate, tuple[int, ...]], SimulationResult | None] = {}
        comps = workflow.components
        index = {n: i for i, n in enumerate(self.names)}
        self._batch = tuple(workflow.batch_of(n) for n in self.names)
        self._unit = tuple(c.micro_batch_multiple for c in comps)
        self._group = tuple(tuple(index[m] for m in workflow.micro_batch_group(n))
                            for n in self.names)
        """Per component: the components sharing its micro-batch, the leader first."""
        self._leaders = tuple(i for i in range(len(comps)) if self._group[i][0] == i)
        self._even = tuple(c.split_evenly for c in comps)
        self._divides = tuple(None if c.devices_divide is None else index[c.devices_divide]
                              for c in comps)
        """Per component: the component whose device count its own must divide, or None."""
        loop = [workflow.loop_of(n) for n in self.names]
        self._loop_pairs = tuple((i, j) for i, j in itertools.combinations(range(len(comps)), 2)
                                 if loop[i] is not None and loop[i] == loop[j])
        """Pairs of components of one loop: they take turns on the same devices or run on
        disjoint ones, never on partly shared devices (a runtime process holds a device for
        its whole part of the loop, so two processes of a loop on one device would each
        wait for the other)."""
        memories = {d.memory_bytes for d in cluster.devices}
        self._uniform_memory = next(iter(memories)) if len(memories) == 1 else None
        self._set_order(order)

    def _set_order(self, order: Sequence[int] | None) -> None:
        n = self.cluster.num_devices
        self.order = tuple(range(n)) if order is None else tuple(order)
        if sorted(self.order) != list(range(n)):
            raise PlanningError(f"device order {list(self.order)} is not a permutation of the "
                                f"cluster's {n} devices")
        devices = self.cluster.devices
        self._identity = self.order == tuple(range(n))
        self._memory = tuple(devices[d].memory_bytes for d in self.order)
        self._node = tuple(devices[d].node for d in self.order)
        breaks = [0]
        for a, b in itertools.pairwise(self._node):
            breaks.append(breaks[-1] + (a != b))
        self._breaks = tuple(breaks)
        self._shares: dict[tuple[int, int], tuple[tuple[int, float], ...]] = {}
        self._parallel: dict[tuple[int, int], int] = {}

    def reordered(self, order: Sequence[int]) -> Evaluator:
        """An evaluator over device `order` that shares this one's caches (simulations are
        memoised by signature, which does not depend on the order)."""
        other = copy.copy(self)
        other._sim = {}
        other._set_order(order)
        return other

    @property
    def simulations(self) -> int:
        """Simulations run so far by this evaluator and those sharing its caches."""
        return self._shared.ticker.simulations

    @property
    def ticker(self) -> Ticker:
        """The progress of the planning run this evaluator belongs to."""
        return self._shared.ticker

    # ------------------------------------------------------------------ constraints
    def can_run(self, index: int, num_devices: int) -> bool:
        """Whether component `index` may run on `num_devices` devices: its device
        constraints, and at least one unit of its batch per device."""
        return (self.workflow.components[index].allows(num_devices)
                and num_devices * self._unit[index] <= self._batch[index])

    def most_devices(self, index: int) -> int:
        """Most devices component `index` can use: one unit of its batch each, within
        `max_devices` and the cluster."""
        comp = self.workflow.components[index]
        cap = min(self.cluster.num_devices, self._batch[index] // self._unit[index])
        return cap if comp.max_devices is None else min(cap, comp.max_devices)

    def fit(self, indices: Iterable[int], devices: int) -> int:
        """The most devices, at most `devices`, on which every component of `indices` can
        run (`can_run`); 0 when there is no such count."""
        indices = tuple(indices)
        top = min([devices, *(self.most_devices(i) for i in indices)])
        return next((d for d in range(top, 0, -1)
                     if all(self.can_run(i, d) for i in indices)), 0)

    def fits_alone(self, index: int, start: int, stop: int) -> bool:
        """Whether component `index` fits alone in the least memory of positions
        ``[start, stop)`` with some size it can run there (else every simulation of it
        there fails: pruned before simulating)."""
        if self.workflow.components[index].resource != "gpu":
            return True
        n = stop - start
        key = (index, n)
        least = self._shared.least_memory
        if key not in least:
            sizes = self._sizes(self._group[index][0], n * self._unit[index])
            least[key] = min((self.cost.memory(self.names[index], batch_size=s, num_devices=n)
                              for s in sizes), default=0)
        return least[key] <= self._atom_memory(start, stop)

    def allowed(self, candidate: Candidate) -> bool:
        """Whether every component's device count passes `can_run`, divides the count of
        the component it must (`Component.devices_divide`), and its range `fits_alone`."""
        counts = [stop - start for start, stop in candidate]
        return all(self.can_run(i, counts[i]) and self.fits_alone(i, start, stop)
                   and self._divides_ok(i, counts)
                   for i, (start, stop) in enumerate(candidate))

    def _divides_ok(self, index: int, counts: Sequence[int]) -> bool:
        other = self._divides[index]
        return other is None or counts[other] % counts[index] == 0

    def options(self, candidate: Candidate) -> tuple[tuple[int, ...], ...]:
        """Per component (names order) its runnable micro-batch sizes on the candidate's
        devices, coarse to fine; components sharing a micro-batch get the same sizes."""
        counts = [stop - start for start, stop in candidate]
        out: list[tuple[int, ...]] = []
        for group in self._group:
            need = max(counts[j] * self._unit[j] for j in group)
            sizes = self._sizes(group[0], need)
            even = {counts[j] for j in group if self._even[j] and counts[j] > 1}
            if even:  # every call splits evenly over each such member's devices
                batch = self._batch[group[0]]
                # None at all: keep them, and `runnable` rejects the candidate's simulations.
                sizes = tuple(s for s in sizes if all(
                    s % d == 0 and smallest_call(batch, s) % d == 0 for d in even)) or sizes
            out.append(sizes)
        return tuple(out)

    def _sizes(self, leader: int, items_per_call: int) -> tuple[int, ...]:
        key = (leader, items_per_call)
        cache = self._shared.sizes
        if key not in cache:
            cache[key] = runnable_sizes(self.choices[self.names[leader]], self._batch[leader],
                                        items_per_call=items_per_call)
        return cache[key]

    def conform(self, candidate: Candidate, sizes: Sequence[int]) -> tuple[int, ...]:
        """`sizes` made runnable on `candidate`: a size that is not becomes the smallest
        runnable one above it (at worst the whole batch); followers take their leader's."""
        options = self.options(candidate)
        out = list(sizes)
        for i in self._leaders:
            if out[i] not in options[i]:
                out[i] = min((s for s in options[i] if s >= out[i]), default=options[i][0])
        return tuple(out[group[0]] for group in self._group)

    # ------------------------------------------------------------------ layout
    def devices(self, candidate: Candidate) -> tuple[tuple[int, ...], ...]:
        """Each component's device indices (the candidate mapped through the order)."""
        return tuple(tuple(sorted(self.order[s:e])) for s, e in candidate)

    def _atom_memory(self, lo: int, hi: int) -> int:
        if self._uniform_memory is not None:
            return self._uniform_memory
        return min(self._memory[lo:hi])

    def _node_of(self, start: int, stop: int) -> int | None:
        """The node holding positions ``[start, stop)``, or None when they span nodes."""
        return self._node[start] if self._breaks[stop - 1] == self._breaks[start] else None

    def layout(self, candidate: Candidate, *, record: bool = False) -> Layout:
        """Atoms of a range candidate (segments between range boundaries); with `record`,
        the devices of each atom (for recorded intervals)."""
        cuts = sorted({b for rng in candidate for b in rng})
        atoms: list[tuple[int, int]] = []
        members: list[list[str]] = []
        for lo, hi in itertools.pairwise(cuts):
            inside = [n for n, (s, e) in zip(self.names, candidate, strict=True) if s <= lo < e]
            if inside:
                atoms.append((lo, hi - lo))
                members.append(inside)
        comp_atoms: dict[str, list[int]] = {n: [] for n in self.names}
        for i, inside in enumerate(members):
            for n in inside:
                comp_atoms[n].append(i)
        device_lists: tuple[tuple[int, ...], ...] = ()
        if record or not self._identity:
            device_lists = tuple(tuple(sorted(self.order[lo:lo + size])) for lo, size in atoms)
        return Layout(
            atoms=tuple(atoms),
            atom_memory=tuple(self._atom_memory(lo, lo + size) for lo, size in atoms),
            comp_atoms={n: tuple(a) for n, a in comp_atoms.items()},
            comp_devices={n: e - s for n, (s, e) in zip(self.names, candidate, strict=True)},
            comp_node={n: self._node_of(s, e)
                       for n, (s, e) in zip(self.names, candidate, strict=True)},
            comp_sets={n: frozenset(a) for n, a in comp_atoms.items()},
            device_lists=device_lists,
        )

    def signature(self, candidate: Candidate) -> Signature:
        """The candidate's simulation signature (module docstring)."""
        cuts = sorted({b for rng in candidate for b in rng})
        atoms: set[tuple[int, int]] = set()
        for lo, hi in itertools.pairwise(cuts):
            mask = 0
            for i, (s, e) in enumerate(candidate):
                if s <= lo < e:
                    mask |= 1 << i
            if mask:
                atoms.add((mask, self._atom_memory(lo, hi)))
        nodes = [self._node_of(s, e) for s, e in candidate]
        same = tuple(-1 if nd is None else nodes.index(nd) for nd in nodes)
        split: tuple[tuple[tuple[int, int], ...], ...] = ()
        if self._sharing is not None and len(self.cluster.nodes) > 1:
            # Shared cores: how a range splits over nodes sets its threads and cores there.
            split = tuple(self._threads(s, e) for s, e in candidate)
        return tuple(e - s for s, e in candidate), frozenset(atoms), same, split

    def _threads(self, start: int, stop: int) -> tuple[tuple[int, int], ...]:
        """(node, positions of ``[start, stop)`` on it) per node, in node order."""
        counts: dict[int, int] = {}
        for d in self.order[start:stop]:
            node = self.cluster.devices[d].node
            counts[node] = counts.get(node, 0) + 1
        return tuple(sorted(counts.items()))

    def runnable(self, candidate: Candidate, sizes: Sequence[int]) -> bool:
        """Whether the runtime runs `sizes` on `candidate`: device counts that divide where
        they must (`Component.devices_divide`), calls that split evenly where they must
        (`Component.split_evenly`), and a loop's components on the same devices or on
        disjoint ones."""
        for i, j in self._loop_pairs:
            (a0, a1), (b0, b1) = candidate[i], candidate[j]
            if candidate[i] != candidate[j] and max(a0, b0) < min(a1, b1):
                return False
        counts = [stop - start for start, stop in candidate]
        for i, size in enumerate(sizes):
            if not self._divides_ok(i, counts):
                return False
            if self._even[i] and counts[i] > 1 and (
                    size % counts[i] or smallest_call(self._batch[i], size) % counts[i]):
                return False
        return True

    # ------------------------------------------------------------------ scoring
    def simulate(self, candidate: Candidate, sizes: Sequence[int],
                 *, record: bool = False) -> SimulationResult | None:
        """Simulate with micro-batch `sizes` (names order); None when it does not fit or
        the runtime cannot run it (`runnable`)."""
        key = (candidate, tuple(sizes))
        if key in self._sim and not record:
            return self._sim[key]
        if not self.runnable(candidate, sizes):
            self._sim[key] = None
            return None
        by_signature = self._shared.by_signature
        if not record:
            by_sig = (self.signature(candidate), key[1])
            if by_sig in by_signature:
                self._sim[key] = by_signature[by_sig]
                return self._sim[key]
        try:
            result: SimulationResult | None = simulate_layout(
                self.workflow, self.layout(candidate, record=record), self.cost, self.cluster,
                micro_batch=dict(zip(self.names, sizes, strict=True)), record=record,
                memo=self._shared.memo)
        except PlanningError:
            result = None
        self._shared.ticker.simulated(None if result is None else result.iteration_time)
        self._sim[key] = result
        if not record:
            by_signature[by_sig] = result
        return result

    def time(self, candidate: Candidate, sizes: Sequence[int]) -> float:
        """Simulated iteration time, infinite when infeasible."""
        result = self.simulate(candidate, sizes)
        return math.inf if result is None else result.iteration_time

    def uniform_sizes(self, candidate: Candidate, chunks: int, *,
                      split: Sequence[bool] | None = None,
                      short_whole: bool = False) -> tuple[int, ...]:
        """Components split into (about) `chunks` micro-batches (only where `split` is True
        for some component of its micro-batch group), within the runnable sizes. A component
        with fewer sizes than that level (too many devices for so small calls) takes its
        finest, or with `short_whole` its whole batch."""
        options = self.options(candidate)
        level = max(0, chunks.bit_length() - 1)
        out = []
        for i, group in enumerate(self._group):
            opts = options[i]
            splits = split is None or any(split[j] for j in group)
            if not splits or (short_whole and level >= len(opts)):
                out.append(opts[0])
            else:
                out.append(opts[min(len(opts) - 1, level)])
        return tuple(out)

    def pipelined(self, candidate: Candidate) -> tuple[bool, ...]:
        """Which components may gain from micro-batches: those connected (through edges) to
        an edge between different device ranges. Splitting where every neighbour takes turns
        on exactly the same devices only adds calls; but once some stage streams across
        devices, every stage along the chain can work on a micro-batch while the others wait
        (in ``a: 0-2, b: 0`` devices 1-2 go on producing while device 0 consumes; in
        ``a: 0, b,c: 1`` c fills device 1 while b waits for a's next micro-batch)."""
        ranges = dict(zip(self.names, candidate, strict=True))
        edges = self.workflow.edges
        flagged = {n for e in edges if ranges[e.src] != ranges[e.dst] for n in (e.src, e.dst)}
        grown = True
        while grown:
            grown = False
            for e in edges:
                if (e.src in flagged) != (e.dst in flagged):
                    flagged |= {e.src, e.dst}
                    grown = True
        return tuple(n in flagged for n in self.names)

    def coarse(self, candidate: Candidate) -> tuple[float, tuple[int, ...]]:
        """A few simulations: whole batches, and 2 or 4 micro-batches where stages pipeline
        (everywhere there, only in the producers, or only in the sinks)."""
        masks = self._split_masks(self.pipelined(candidate))
        return self._best_uniform(candidate, (1, 2, 4), masks)

    def quick(self, candidate: Candidate) -> tuple[float, tuple[int, ...]]:
        """Best time over uniform splits (1, 2, 4, … chunks everywhere, or in the `coarse`
        patterns): a fast score."""
        levels = max(len(o) for o in self.options(candidate))
        masks = (None, *self._split_masks(self.pipelined(candidate)))
        return self._best_uniform(candidate, [1 << level for level in range(levels)], masks)

    def _best_uniform(self, candidate: Candidate, chunk_counts: Sequence[int],
                      masks: Sequence[Sequence[bool] | None]) -> tuple[float, tuple[int, ...]]:
        """Fastest simulated time over `chunk_counts` uniform splits of each mask's
        components (None: all), components short of sizes at their finest or whole, with
        its micro-batch sizes."""
        best = (math.inf, self.uniform_sizes(candidate, 1))
        tried: set[tuple[int, ...]] = set()
        for chunks in chunk_counts:
            for mask in masks:
                for short_whole in (False, True):
                    sizes = self.uniform_sizes(candidate, chunks, split=mask,
                                               short_whole=short_whole)
                    if sizes in tried:
                        continue
                    tried.add(sizes)
                    t = self.time(candidate, sizes)
                    if t < best[0]:
                        best = (t, sizes)
        return best

    def _split_masks(self, split: tuple[bool, ...]) -> tuple[tuple[bool, ...], ...]:
        """`split`, and `split` restricted to the producers or to the sinks: a last stage
        (typically training, one optimizer step) may want the whole batch to save its per-call
        cost (e.g. a gradient all-reduce per micro-batch) while its producers stream, or a
        costly-per-call producer may hand a whole batch to a consumer that streams on."""
        sources = {e.src for e in self.workflow.edges}
        feeders = tuple(s and n in sources for s, n in zip(split, self.names, strict=True))
        sinks = tuple(s and n not in sources for s, n in zip(split, self.names, strict=True))
        return tuple(dict.fromkeys((split, feeders, sinks)))

    def _expand(self, leader_sizes: Sequence[int]) -> tuple[int, ...]:
        """Sizes of every component from those of the micro-batch leaders (`_leaders`)."""
        by_leader = dict(zip(self._leaders, leader_sizes, strict=True))
        return tuple(by_leader[group[0]] for group in self._group)

    def best(self, candidate: Candidate, *, exhaustive: bool = False,
             below: float | None = None) -> Scored | None:
        """Best runnable micro-batches for `candidate`: every combination when there are few
        (or when `exhaustive`), else coordinate descent from the best uniform split.

        With `below` (enumeration only), combinations whose `sized_bound` reaches the best time
        found so far or `below` are not simulated: exact for every result under `below`.
        None when nothing fits (or, with `below`, nothing can beat it).
        """
        all_options = self.options(candidate)
        options = [all_options[i] for i in self._leaders]
        total = math.prod(len(o) for o in options)
        if exhaustive or (below is not None and total <= self.enumerate_limit):
            return self._best_exhaustive(candidate, options,
                                         math.inf if below is None else below)
        if total <= self.enumerate_limit:
            best_t, best_sizes = math.inf, self._expand([o[0] for o in options])
            for sizes in (self._expand(c) for c in itertools.product(*options)):
                t = self.time(candidate, sizes)
                if t < best_t or (t == best_t and sizes < best_sizes):
                    best_t, best_sizes = t, sizes
        else:
            best_t, best_sizes = self.quick(candidate)
            improved = True
            while improved:
                improved = False
                for i in self._leaders:
                    for size in all_options[i]:
                        trial = tuple(size if group[0] == i else s
                                      for s, group in zip(best_sizes, self._group, strict=True))
                        t = self.time(candidate, trial)
                        if t < best_t - 1e-12:
                            best_t, best_sizes, improved = t, trial, True
        return self._scored(candidate, best_t, best_sizes)

    def _best_exhaustive(self, candidate: Candidate, options: Sequence[tuple[int, ...]],
                         below: float) -> Scored | None:
        """`best` over every combination of the leaders' `options`, each `sized_bound` below
        `below` and the best found so far. Kept per signature: candidates with one signature
        (a translation of a layout) have the same combinations and times, so a search under a
        `below` at least as high answers for them too (the optimum when it is under that
        `below`)."""
        signature = self.signature(candidate)
        known = self._shared.best.get(signature)
        if known is not None and known[0] >= below:
            _, best_t, sizes = known
            return None if sizes is None else self._scored(candidate, best_t, sizes)
        combos = [self._expand(c) for c in itertools.product(*options)]
        best_t, best_sizes = math.inf, combos[0]
        # Lowest bound first; stop once the bound cannot win.
        for bound, sizes in sorted((self.sized_bound(candidate, c), c) for c in combos):
            if bound >= min(best_t, below):
                break
            t = self.time(candidate, sizes)
            if t < best_t or (t == best_t and sizes < best_sizes):
                best_t, best_sizes = t, sizes
        found = math.isfinite(best_t)
        self._shared.best[signature] = (below, best_t, best_sizes if found else None)
        return self._scored(candidate, best_t, best_sizes) if found else None

    def _scored(self, candidate: Candidate, best_t: float,
                best_sizes: tuple[int, ...]) -> Scored | None:
        if not math.isfinite(best_t):
            return None
        result = self.simulate(candidate, best_sizes)
        if result is None:  # pragma: no cover - finite time implies a result
            return None
        return Scored(candidate, dict(zip(self.names, best_sizes, strict=True)), best_t, result,
                      self.devices(candidate))

    # ------------------------------------------------------------------ bounds
    def work(self, name: str, devices: int) -> float:
        """Least total compute seconds of `name` per iteration on `devices` devices, over
        the sizes it can run there (a superset of those its micro-batch group can)."""
        key = (name, devices, 0)
        cache = self._shared.work
        if key not in cache:
            i = self.names.index(name)
            batch = self._batch[i]
            best = math.inf
            for size in self._sizes(self._group[i][0], devices * self._unit[i]):
                full, rest = divmod(batch, size)
                t = full * self.cost.time(name, batch_size=size, num_devices=devices)
                if rest:
                    t += self.cost.time(name, batch_size=rest, num_devices=devices)
                best = min(best, t)
            cache[key] = best * self.workflow.steps_of(name)
        return cache[key]

    def sized_work(self, name: str, devices: int, size: int) -> float:
        """Total compute seconds of `name` per iteration on `devices` devices with micro-batch
        `size` (streaming components make one call whatever `size`)."""
        key = (name, devices, size)
        cache = self._shared.work
        if key not in cache:
            batch = self.workflow.batch_of(name)
            if self.workflow.component(name).streaming:
                size = batch
            full, rest = divmod(batch, size)
            t = full * self.cost.time(name, batch_size=size, num_devices=devices)
            if rest:
                t += self.cost.time(name, batch_size=rest, num_devices=devices)
            cache[key] = t * self.workflow.steps_of(name)
        return cache[key]

    def parallel(self, start: int, stop: int) -> int:
        """How many of devices ``start..stop-1`` compute at once: the device count cost
        curves are read at, as the simulator reads them (`CoreSharing.parallel_devices`: CPU
        slots beyond their node's cores add none)."""
        if self._sharing is None:
            return stop - start
        key = (start, stop)
        if key not in self._parallel:
            self._parallel[key] = self._sharing.parallel_devices(self.order[start:stop],
                                                                 self.cluster)
        return self._parallel[key]

    def core_shares(self, start: int, stop: int) -> tuple[tuple[int, float], ...]:
        """Per contended node, the fraction of its cores a call on positions
        ``[start, stop)`` keeps busy per second of its profiled time: ``t × speed(t) / C``
        for its ``t`` slots there. Whatever runs beside it, a call computes at
        ``speed(T) / speed(t)`` of its profiled rate on ``t × speed(T)`` cores, and a node's
        computing threads never hold more than its ``C`` cores, so a node's summed work times
        these shares bounds the iteration from below (`lower_bound`). Empty without sharing."""
        key = (start, stop)
        if key not in self._shares:
            sharing = self._sharing
            self._shares[key] = () if sharing is None else tuple(
                (node, t * sharing.speed(node, t) / sharing.cores[node])
                for node, t in self._threads(start, stop) if node in sharing.cores)
        return self._shares[key]

    def sized_bound(self, candidate: Candidate, sizes: Sequence[int]) -> float:
        """`lower_bound` for the micro-batch `sizes` (names order)."""
        works = [self.sized_work(n, self.parallel(start, stop), size)
                 for n, (start, stop), size in zip(self.names, candidate, sizes, strict=True)]
        return self._busiest(works, candidate)

    def lower_bound(self, candidate: Candidate) -> float:
        """No schedule beats this: the busiest component, device or shared node's cores
        (`core_shares`), counting only compute (switches and waiting only add time)."""
        works = [self.work(n, self.parallel(start, stop))
                 for n, (start, stop) in zip(self.names, candidate, strict=True)]
        return self._busiest(works, candidate)

    def _busiest(self, works: Sequence[float], candidate: Candidate) -> float:
        """The busiest component, device or shared node's cores: each device runs its
        components one at a time, and a node's cores serve all of its slots
        (`core_shares`)."""
        bound = max(works)
        cuts = sorted({b for rng in candidate for b in rng})
        for lo in cuts[:-1]:
            load = sum(w for w, (s, e) in zip(works, candidate, strict=True) if s <= lo < e)
            bound = max(bound, load)
        if self._sharing is not None:
            cores: dict[int, float] = {}
            for w, (s, e) in zip(works, candidate, strict=True):
                for node, share in self.core_shares(s, e):
                    cores[node] = cores.get(node, 0.0) + w * share
            bound = max(bound, max(cores.values(), default=0.0) * (1 - CORE_SLACK))
        return bound * (1 - BOUND_SLACK)

    # ------------------------------------------------------------------ results
    def to_plan(self, scored: Scored, *, label: str = "") -> ExecutionPlan:
        """The `ExecutionPlan` of a scored candidate (on its own evaluator's devices)."""
        devices = scored.devices or self.devices(scored.candidate)
        comps = {n: ComponentPlacement(n, devs)
                 for n, devs in zip(self.names, devices, strict=True)}
        placement = Placement(comps, derive_mode(comps.values()), self.cluster.num_devices)
        granularity = {e.key: scored.micro_batch[e.dst] for e in self.workflow.edges}
        return ExecutionPlan(placement, dict(scored.micro_batch), granularity, scored.time,
                             scored.result.utilisation, label or placement.mode.value)


BOUND_SLACK = 1e-9
"""Relative amount bounds are shaved by, so that summing the same call times in another
order than the simulator does can never lift a bound above a simulated time."""

CORE_SLACK = 1e-6
"""Relative amount the shared-cores bound is shaved by besides: the simulator advances shared
calls event by event and ends a call within a tolerance of its work."""
