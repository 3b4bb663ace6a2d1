"""The search space and the scorer shared by the exhaustive and the heuristic planner.

A candidate placement gives every component one contiguous device range ``[start, stop)``
(collocated: all the same range; disaggregated: disjoint ranges; hybrid: anything else, e.g.
``env: 0-3, rollout: 4-7, actor: 0-7``). `Evaluator` scores a candidate by simulation, picks
its best micro-batches, memoises everything, and gives a cheap lower bound used for pruning.

Simulations are memoised by the candidate's *signature*: the device count of each component,
the set of distinct atoms (which components share a device group, and its device memory)
and which components sit on the same node. A simulation reads nothing else of the placement,
so candidates with one signature (e.g. translations of a layout inside a node) share one
simulation, exactly.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import structlog

from rlinf.sched.cluster import Cluster
from rlinf.sched.costs import CostModel
from rlinf.sched.errors import PlanningError
from rlinf.sched.placement import ComponentPlacement, Placement, derive_mode
from rlinf.sched.plan import ExecutionPlan
from rlinf.sched.simulator import CachedCostModel, Layout, SimulationResult, simulate_layout
from rlinf.sched.workflow import Workflow

__all__ = ["Candidate", "Evaluator", "Scored", "Signature", "chunk_choices"]

_log = structlog.get_logger(__name__)

Candidate = tuple[tuple[int, int], ...]
"""One ``(start, stop)`` device range per component, in `Workflow.names` order."""

Signature = tuple[tuple[int, ...], frozenset[tuple[int, int]], tuple[int, ...]]
"""What a simulation reads of a candidate: device counts, atoms as (component bit mask,
device memory), and per component the first component on its node (-1: spans nodes)."""


def chunk_choices(workflow: Workflow, *, max_chunks: int) -> dict[str, tuple[int, ...]]:
    """Candidate micro-batch sizes per component: the batch split into 1, 2, 4, … chunks."""
    out: dict[str, tuple[int, ...]] = {}
    for c in workflow.components:
        batch = workflow.batch_of(c.name)
        if c.streaming:
            out[c.name] = (batch,)
            continue
        sizes: list[int] = []
        k = 1
        while k <= max_chunks and k <= batch:
            size = math.ceil(batch / k)
            if size not in sizes:
                sizes.append(size)
            k *= 2
        out[c.name] = tuple(sizes)
    return out


@dataclass(frozen=True)
class Scored:
    """A candidate with its best micro-batches and simulated time."""

    candidate: Candidate
    micro_batch: Mapping[str, int]
    time: float
    result: SimulationResult


class Evaluator:
    """Scores candidates: memoised simulation, micro-batch search and lower bounds."""

    def __init__(self, workflow: Workflow, cost: CostModel, cluster: Cluster, *,
                 max_chunks: int = 16, enumerate_limit: int = 256) -> None:
        self.workflow = workflow
        self.cost = cost if isinstance(cost, CachedCostModel) else CachedCostModel(cost)
        self.cluster = cluster
        self.names = workflow.names
        self.choices = chunk_choices(workflow, max_chunks=max_chunks)
        self.enumerate_limit = enumerate_limit
        self.simulations = 0
        self._sim: dict[tuple[Candidate, tuple[int, ...]], SimulationResult | None] = {}
        self._by_signature: dict[tuple[Signature, tuple[int, ...]], SimulationResult | None] = {}
        self._work: dict[tuple[str, int, int], float] = {}
        self._memo: dict[Any, Any] = {}
        memories = {d.memory_bytes for d in cluster.devices}
        self._uniform_memory = next(iter(memories)) if len(memories) == 1 else None

    # ------------------------------------------------------------------ constraints
    def allowed(self, candidate: Candidate) -> bool:
        """Whether every component's device count meets its divisibility constraints."""
        return all(self.workflow.components[i].allows(stop - start)
                   for i, (start, stop) in enumerate(candidate))

    # ------------------------------------------------------------------ layout
    def layout(self, candidate: Candidate) -> Layout:
        """Atoms of a range candidate (segments between range boundaries)."""
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
        if self._uniform_memory is not None:
            atom_memory = tuple(self._uniform_memory for _ in atoms)
        else:
            atom_memory = tuple(min(self.cluster.devices[d].memory_bytes
                                    for d in range(lo, lo + size)) for lo, size in atoms)
        node_of = self.cluster.node_of
        comp_node: dict[str, int | None] = {}
        for n, (s, e) in zip(self.names, candidate, strict=True):
            comp_node[n] = node_of(s) if node_of(s) == node_of(e - 1) else None
        return Layout(
            atoms=tuple(atoms), atom_memory=atom_memory,
            comp_atoms={n: tuple(a) for n, a in comp_atoms.items()},
            comp_devices={n: e - s for n, (s, e) in zip(self.names, candidate, strict=True)},
            comp_node=comp_node,
            comp_sets={n: frozenset(a) for n, a in comp_atoms.items()},
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
                memory = self._uniform_memory if self._uniform_memory is not None else min(
                    self.cluster.devices[d].memory_bytes for d in range(lo, hi))
                atoms.add((mask, memory))
        node_of = self.cluster.node_of
        nodes = [node_of(s) if node_of(s) == node_of(e - 1) else None for s, e in candidate]
        same = tuple(-1 if nd is None else nodes.index(nd) for nd in nodes)
        return tuple(e - s for s, e in candidate), frozenset(atoms), same

    # ------------------------------------------------------------------ scoring
    def simulate(self, candidate: Candidate, sizes: Sequence[int],
                 *, record: bool = False) -> SimulationResult | None:
        """Simulate with micro-batch `sizes` (names order); None when it does not fit."""
        key = (candidate, tuple(sizes))
        if key in self._sim and not record:
            return self._sim[key]
        if not record:
            by_sig = (self.signature(candidate), key[1])
            if by_sig in self._by_signature:
                self._sim[key] = self._by_signature[by_sig]
                return self._sim[key]
        self.simulations += 1
        try:
            result: SimulationResult | None = simulate_layout(
                self.workflow, self.layout(candidate), self.cost, self.cluster,
                micro_batch=dict(zip(self.names, sizes, strict=True)), record=record,
                memo=self._memo)
        except PlanningError:
            result = None
        self._sim[key] = result
        if not record:
            self._by_signature[by_sig] = result
        return result

    def time(self, candidate: Candidate, sizes: Sequence[int]) -> float:
        """Simulated iteration time, infinite when infeasible."""
        result = self.simulate(candidate, sizes)
        return math.inf if result is None else result.iteration_time

    def uniform_sizes(self, chunks: int, *, split: Sequence[bool] | None = None) -> tuple[int, ...]:
        """Components split into (about) `chunks` micro-batches (only where `split` is True)."""
        out = []
        for i, n in enumerate(self.names):
            opts = self.choices[n]
            level = max(0, chunks.bit_length() - 1) if split is None or split[i] else 0
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
        levels = max(len(o) for o in self.choices.values())
        masks = (None, *self._split_masks(self.pipelined(candidate)))
        return self._best_uniform(candidate, [1 << level for level in range(levels)], masks)

    def _best_uniform(self, candidate: Candidate, chunk_counts: Sequence[int],
                      masks: Sequence[Sequence[bool] | None]) -> tuple[float, tuple[int, ...]]:
        """Fastest simulated time over `chunk_counts` uniform splits of each mask's
        components (None: all), with its micro-batch sizes."""
        best = (math.inf, self.uniform_sizes(1))
        tried: set[tuple[int, ...]] = set()
        for chunks in chunk_counts:
            for mask in masks:
                sizes = self.uniform_sizes(chunks, split=mask)
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

    def best(self, candidate: Candidate, *, exhaustive: bool = False,
             below: float | None = None) -> Scored | None:
        """Best micro-batches for `candidate`: every combination when there are few (or when
        `exhaustive`), else coordinate descent from the best uniform split.

        With `below` (enumeration only), combinations whose `sized_bound` reaches the best time
        found so far or `below` are not simulated: exact for every result under `below`.
        None when nothing fits (or, with `below`, nothing can beat it).
        """
        options = [self.choices[n] for n in self.names]
        total = math.prod(len(o) for o in options)
        if exhaustive or total <= self.enumerate_limit:
            best_t, best_sizes = math.inf, tuple(o[0] for o in options)
            combos = list(itertools.product(*options))
            if below is not None:  # lowest bound first; stop once the bound cannot win
                ranked = sorted((self.sized_bound(candidate, c), c) for c in combos)
                combos = []
                for bound, sizes in ranked:
                    if bound >= below:
                        break
                    combos.append(sizes)
            for sizes in combos:
                if below is not None and \
                        self.sized_bound(candidate, sizes) >= min(best_t, below):
                    break
                t = self.time(candidate, sizes)
                if t < best_t or (t == best_t and sizes < best_sizes):
                    best_t, best_sizes = t, sizes
        else:
            best_t, best_sizes = self.quick(candidate)
            improved = True
            while improved:
                improved = False
                for i, opts in enumerate(options):
                    for size in opts:
                        trial = (*best_sizes[:i], size, *best_sizes[i + 1:])
                        t = self.time(candidate, trial)
                        if t < best_t - 1e-12:
                            best_t, best_sizes, improved = t, trial, True
        if not math.isfinite(best_t):
            return None
        result = self.simulate(candidate, best_sizes)
        if result is None:  # pragma: no cover - finite time implies a result
            return None
        return Scored(candidate, dict(zip(self.names, best_sizes, strict=True)), best_t, result)

    # ------------------------------------------------------------------ bounds
    def work(self, name: str, devices: int) -> float:
        """Least total compute seconds of `name` per iteration on `devices` devices."""
        key = (name, devices, 0)
        if key not in self._work:
            batch = self.workflow.batch_of(name)
            best = math.inf
            for size in self.choices[name]:
                full, rest = divmod(batch, size)
                t = full * self.cost.time(name, batch_size=size, num_devices=devices)
                if rest:
                    t += self.cost.time(name, batch_size=rest, num_devices=devices)
                best = min(best, t)
            self._work[key] = best * self.workflow.steps_of(name)
        return self._work[key]

    def sized_work(self, name: str, devices: int, size: int) -> float:
        """Total compute seconds of `name` per iteration on `devices` devices with micro-batch
        `size` (streaming components make one call whatever `size`)."""
        key = (name, devices, size)
        if key not in self._work:
            batch = self.workflow.batch_of(name)
            if self.workflow.component(name).streaming:
                size = batch
            full, rest = divmod(batch, size)
            t = full * self.cost.time(name, batch_size=size, num_devices=devices)
            if rest:
                t += self.cost.time(name, batch_size=rest, num_devices=devices)
            self._work[key] = t * self.workflow.steps_of(name)
        return self._work[key]

    def sized_bound(self, candidate: Candidate, sizes: Sequence[int]) -> float:
        """`lower_bound` for the micro-batch `sizes` (names order)."""
        works = [self.sized_work(n, stop - start, size)
                 for n, (start, stop), size in zip(self.names, candidate, sizes, strict=True)]
        return _busiest(works, candidate)

    def lower_bound(self, candidate: Candidate) -> float:
        """No schedule beats this: the busiest component or the busiest device, counting only
        compute (switches and waiting only add time)."""
        works = [self.work(n, stop - start)
                 for n, (start, stop) in zip(self.names, candidate, strict=True)]
        return _busiest(works, candidate)

    # ------------------------------------------------------------------ results
    def to_plan(self, scored: Scored, *, label: str = "") -> ExecutionPlan:
        """The `ExecutionPlan` of a scored candidate."""
        comps = {n: ComponentPlacement(n, tuple(range(s, e)))
                 for n, (s, e) in zip(self.names, scored.candidate, strict=True)}
        placement = Placement(comps, derive_mode(comps.values()), self.cluster.num_devices)
        granularity = {e.key: scored.micro_batch[e.dst] for e in self.workflow.edges}
        return ExecutionPlan(placement, dict(scored.micro_batch), granularity, scored.time,
                             scored.result.utilisation, label or placement.mode.value)


BOUND_SLACK = 1e-9
"""Relative amount bounds are shaved by, so that summing the same call times in another
order than the simulator does can never lift a bound above a simulated time."""


def _busiest(works: Sequence[float], candidate: Candidate) -> float:
    """The busiest component or device: each device runs its components one at a time."""
    bound = max(works)
    cuts = sorted({b for rng in candidate for b in rng})
    for lo in cuts[:-1]:
        load = sum(w for w, (s, e) in zip(works, candidate, strict=True) if s <= lo < e)
        bound = max(bound, load)
    return bound * (1 - BOUND_SLACK)
