"""Discrete-event simulation of one training iteration under a placement.

The model, kept small enough to compute by hand:

- Each component processes its batch (per step, `steps` times inside a loop) in micro-batches
  of `micro_batch[c]` items: one call per micro-batch, each costing
  ``cost.time(c, batch_size=items, num_devices=len(devices))`` and occupying all its devices.
  A streaming component makes one call for its whole batch and emits item fractions as they
  complete (`Component.completion`), so consumers start before it ends.
- A consumer's micro-batch j waits for the producer output that covers the same fraction of
  the batch, plus a transfer of its bytes over ``min(|src devices|, |dst devices|)`` links of
  the cluster's intra- or inter-node bandwidth and the link's latency once per message
  (free when both use the same device set).
  Transfers overlap compute and do not contend.
- Components on disjoint devices run concurrently. On shared devices the call that can start
  earliest goes first (ties: dependency order), as the device lock grants turns: without idle
  time each component keeps the device for all its calls (step by step in loops), while a
  consumer's ready micro-batch fills a gap in which its producer waits (e.g. a trainer
  sharing a device with a reward stage that a rollout elsewhere feeds piecemeal).
  Context switches follow the one switch rule of `rlinf.sched.residency`, the same rule the
  device lock applies: components that fit in a device's memory together stay co-resident
  and never switch; a component that is not resident when it gets the device pays
  ``cost.switch_time(c)`` (offload + onload), evicting least recently used residents until
  it fits. A switch starts once the device is free *and* the call's input has arrived (the
  lock is requested with the input in hand). The residents at the start of the iteration are
  those at its end (the steady state of a repeated iteration). CPU components need no device
  memory and never switch. A component whose own memory exceeds a device's raises
  `PlanningError`.
- A call that takes its devices after another process's call (or takes them first in the
  iteration) starts `Cluster.turn_latency` later, after any switch: the lock's hand-over and
  the new holder's wake-up, during which the devices idle. Only devices that a component in
  another process also runs on count: alone on its devices a component takes no turns (the
  runtime gives it no lock). Of two calls ready at once, one that keeps its component's turn
  therefore goes first. Messages between components the runtime runs in one process pay no
  `Cluster.message_latency`: those on exactly the same single device with one process each,
  unless `Component.isolated` (`rlinf.sched.process_sets`; with several ranks a producer's
  items also reach consumer ranks in the other processes). Members of one loop on the same
  devices hand over nothing between their calls (a process holds its device for its whole
  part of a loop, so loop partners that share devices are inlined, and the planner places
  them on the same devices or on disjoint ones).

The result gives the iteration time, utilisation (compute device-seconds over all devices ×
time) and, on request, every busy interval for a Gantt chart.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from rlinf.sched.cluster import Cluster
from rlinf.sched.core_sharing import CoreSharing
from rlinf.sched.costs import CostModel
from rlinf.sched.errors import PlanningError
from rlinf.sched.placement import Placement
from rlinf.sched.residency import Residency
from rlinf.sched.workflow import Component, Workflow

__all__ = ["CachedCostModel", "Interval", "SimulationResult", "simulate"]


@dataclass(frozen=True)
class Interval:
    """A span during which a component occupies its devices."""

    component: str
    devices: tuple[int, ...]
    start: float
    end: float
    kind: str = "compute"
    """``"compute"`` or ``"switch"`` (offload + onload)."""
    step: int = 0
    chunk: int = 0


@dataclass(frozen=True)
class SimulationResult:
    """Outcome of simulating one iteration."""

    iteration_time: float
    """Seconds from the start of the iteration until the last call ends."""
    utilisation: float
    """Compute device-seconds / (cluster devices × iteration time), in [0, 1]."""
    busy_seconds: Mapping[str, float]
    """Per component: compute seconds summed over its calls (wall time, not × devices)."""
    switch_seconds: float
    """Seconds spent switching, summed over switches (wall time)."""
    intervals: tuple[Interval, ...] = ()
    """Every compute and switch interval, when simulated with ``record=True``."""
    switch_counts: Mapping[str, int] = field(default_factory=dict)
    """Per component: how many of its calls paid a context switch (each call switches all
    the component's devices at once)."""

    @property
    def switches(self) -> int:
        """Context switches in the iteration, over all components."""
        return sum(self.switch_counts.values())

    def device_intervals(self, device: int) -> list[Interval]:
        """The recorded intervals that occupy `device`, by start time."""
        return sorted((i for i in self.intervals if device in i.devices), key=lambda i: i.start)


class CachedCostModel:
    """Memoises a `CostModel` (the planner asks the same questions many times)."""

    def __init__(self, inner: CostModel) -> None:
        self.inner = inner
        self._time: dict[tuple[str, int, int], float] = {}
        self._memory: dict[tuple[str, int, int], int] = {}
        self._switch: dict[str, float] = {}

    def time(self, component: str, *, batch_size: int, num_devices: int) -> float:
        """Memoised `CostModel.time`."""
        key = (component, batch_size, num_devices)
        if key not in self._time:
            self._time[key] = float(
                self.inner.time(component, batch_size=batch_size, num_devices=num_devices))
        return self._time[key]

    def memory(self, component: str, *, batch_size: int, num_devices: int) -> int:
        """Memoised `CostModel.memory`."""
        key = (component, batch_size, num_devices)
        if key not in self._memory:
            self._memory[key] = int(
                self.inner.memory(component, batch_size=batch_size, num_devices=num_devices))
        return self._memory[key]

    def switch_time(self, component: str) -> float:
        """Memoised `CostModel.switch_time`."""
        if component not in self._switch:
            self._switch[component] = float(self.inner.switch_time(component))
        return self._switch[component]


@dataclass(frozen=True)
class Layout:
    """A placement reduced to atoms: maximal device groups with the same components."""

    atoms: tuple[tuple[int, int], ...]
    """Each atom as a (first device, device count) run or an opaque id with its size."""
    atom_memory: tuple[int, ...]
    """Smallest device memory within each atom."""
    comp_atoms: Mapping[str, tuple[int, ...]]
    comp_devices: Mapping[str, int]
    comp_node: Mapping[str, int | None]
    """The node holding all of a component's devices, or None when it spans nodes."""
    comp_sets: Mapping[str, frozenset[int]] = field(default_factory=dict)
    """Atom sets, for equality tests between components."""
    device_lists: tuple[tuple[int, ...], ...] = ()
    """Devices of each atom (only needed when recording intervals)."""
    comp_procs: Mapping[str, int] = field(default_factory=dict)
    """Processes per device of each component (missing: one)."""


def layout_from_placement(placement: Placement, cluster: Cluster) -> Layout:
    """Group the devices of `placement` into atoms (devices shared by the same components)."""
    if placement.num_devices != cluster.num_devices:
        raise PlanningError(f"placement is for {placement.num_devices} devices but the cluster has "
                            f"{cluster.num_devices}: expected the same")
    groups: dict[tuple[str, ...], list[int]] = {}
    for d in placement.used_devices:
        groups.setdefault(tuple(sorted(placement.sharing(d))), []).append(d)
    atoms = list(groups.items())
    comp_atoms: dict[str, list[int]] = {n: [] for n in placement.component_names}
    for i, (names, _) in enumerate(atoms):
        for n in names:
            comp_atoms[n].append(i)
    comp_node: dict[str, int | None] = {}
    for n in placement.component_names:
        nodes = {cluster.node_of(d) for d in placement.devices_of(n)}
        comp_node[n] = next(iter(nodes)) if len(nodes) == 1 else None
    return Layout(
        atoms=tuple((devs[0], len(devs)) for _, devs in atoms),
        atom_memory=tuple(min(cluster.devices[d].memory_bytes for d in devs) for _, devs in atoms),
        comp_atoms={n: tuple(a) for n, a in comp_atoms.items()},
        comp_devices={n: len(placement.devices_of(n)) for n in placement.component_names},
        comp_node=comp_node,
        comp_sets={n: frozenset(a) for n, a in comp_atoms.items()},
        device_lists=tuple(tuple(devs) for _, devs in atoms),
        comp_procs={n: placement.procs_per_device(n) for n in placement.component_names},
    )


def simulate(
    workflow: Workflow,
    placement: Placement,
    cost: CostModel,
    cluster: Cluster,
    *,
    micro_batch: Mapping[str, int] | None = None,
    record: bool = False,
) -> SimulationResult:
    """Simulate one iteration of `workflow` placed by `placement` on `cluster`.

    Args:
        micro_batch: items per call for each component (missing: its whole batch; streaming
            components always make one call).
        record: keep every busy interval (for `rlinf.sched.gantt`).

    Raises:
        PlanningError: a component is not placed, does not fit in device memory, or a
            micro-batch size is out of range.
    """
    missing = [n for n in workflow.names if n not in placement.components]
    if missing:
        raise PlanningError(f"components {missing} are not placed: expected every one of "
                            f"{list(workflow.names)}")
    layout = layout_from_placement(placement, cluster)
    return simulate_layout(workflow, layout, cost, cluster, micro_batch=micro_batch or {},
                           record=record)


def chunk_sizes(workflow: Workflow, micro_batch: Mapping[str, int]) -> dict[str, int]:
    """Validated items per call of each component."""
    sizes: dict[str, int] = {}
    for c in workflow.components:
        batch = workflow.batch_of(c.name)
        size = batch if c.streaming else int(micro_batch.get(c.name, batch))
        if not 1 <= size <= batch:
            raise PlanningError(f"micro-batch {size} for {c.name!r}: expected 1..{batch}")
        sizes[c.name] = size
    return sizes


def _split(total: int, size: int) -> list[int]:
    full, rest = divmod(total, size)
    return [size] * full + ([rest] if rest else [])


@dataclass(frozen=True)
class _Input:
    """One input edge of a component, precomputed for every micro-batch of the consumer."""

    src: str
    rule: int
    """0 same step, 1 previous step (feedback), 2 once before step 0, 3 src's last step,
    4 the previous iteration's (a lagged edge: ready when the iteration starts)."""
    streaming: bool
    index: tuple[int, ...]
    """Per consumer micro-batch: the producer micro-batch that completes its items."""
    fraction: tuple[float, ...]
    """Per consumer micro-batch: the streaming producer's time fraction for its items."""
    nbytes: tuple[float, ...]
    """Per consumer micro-batch: bytes to move."""


def _inputs(workflow: Workflow, name: str, *,
            calls: Sequence[int], sizes: Mapping[str, int]) -> list[_Input]:
    batch = workflow.batch_of(name)
    out = []
    for e in workflow.inputs(name):
        src_loop, dst_loop = workflow.loop_of(e.src), workflow.loop_of(name)
        if e.lagged:
            rule = 4
        elif e.feedback:
            rule = 1
        elif src_loop is not None and src_loop == dst_loop:
            rule = 0
        elif dst_loop is not None:
            rule = 2
        else:
            rule = 3
        src_batch, src_size = workflow.batch_of(e.src), sizes[e.src]
        src_calls = math.ceil(src_batch / src_size)
        per_item = workflow.edge_items(e) * e.bytes_per_item / batch
        index, fraction, nbytes = [], [], []
        done = 0
        for items in calls:
            done += items
            frac = done / batch
            k = max(0, math.ceil(frac * src_batch / src_size - 1e-9) - 1)
            index.append(min(k, src_calls - 1))
            fraction.append(workflow.component(e.src).time_fraction(frac))
            nbytes.append(per_item * items)
        out.append(_Input(e.src, rule, workflow.component(e.src).streaming, tuple(index),
                          tuple(fraction), tuple(nbytes)))
    return out


def simulate_layout(
    workflow: Workflow,
    layout: Layout,
    cost: CostModel,
    cluster: Cluster,
    *,
    micro_batch: Mapping[str, int],
    record: bool = False,
    memo: dict[Any, Any] | None = None,
) -> SimulationResult:
    """`simulate` on a precomputed `Layout` (the planner's fast path).

    `memo` is a dict the caller keeps across calls for one workflow: it caches the
    layout-independent dependency tables per micro-batch choice.
    """
    sizes = chunk_sizes(workflow, micro_batch)
    memory = _memory(workflow, layout, cost, sizes)
    tracked = _tracked_atoms(workflow, layout, memory)
    prepared: dict[str, _Prepared] = {}
    occupants: dict[int, set[str]] = {}
    for comp_name, comp_atoms in layout.comp_atoms.items():
        for atom in comp_atoms:
            occupants.setdefault(atom, set()).add(comp_name)
    sharing = CoreSharing.of(cluster)
    for comp in workflow.components:
        name = comp.name
        batch = workflow.batch_of(name)
        calls = [batch] if comp.streaming else _split(batch, sizes[name])
        ndev = layout.comp_devices[name] if sharing is None else sharing.parallel_devices(
            _devices(layout, layout.comp_atoms[name]), cluster)  # slots beyond the cores
        durations = [cost.time(name, batch_size=items, num_devices=ndev) for items in calls]
        key = (name, sizes[name], *(sizes[e.src] for e in workflow.inputs(name)))
        if memo is not None and key in memo:
            inputs = memo[key]
        else:
            inputs = _inputs(workflow, name, calls=calls, sizes=sizes)
            if memo is not None:
                memo[key] = inputs
        links = [_link(workflow, layout, cluster, inp.src, name) for inp in inputs]
        atoms = layout.comp_atoms[name]
        turn_free = _turn_free(workflow, layout, name) if cluster.turn_latency else frozenset()
        prepared[name] = _Prepared(
            comp, durations, list(zip(inputs, links, strict=True)), workflow.steps_of(name),
            atoms, layout.comp_devices[name],
            tuple(a for a in atoms if a in tracked) if comp.resource == "gpu" else (),
            turn_free, tuple(a for a in atoms if occupants[a] - turn_free))
    tasks = list(_schedule(workflow))
    run = _run
    if sharing is not None:
        threads = {name: sharing.threads(_devices(layout, p.atoms), cluster)
                   for name, p in prepared.items()}
        if any(threads.values()):
            run = functools.partial(_run_shared, sharing=sharing, threads=threads)
    if not tracked:
        return run(workflow, layout, cost, cluster, prepared=prepared, tasks=tasks, residents={},
                   memory=memory, record=record)[0]
    # Steady state: the residents at the start are those at the end. Start from the state a
    # replay of the calls in dependency order leaves, then once more from the simulated end
    # state when the list schedule ordered the calls differently.
    start = _replayed_residents(layout, tasks, prepared, tracked, memory)
    result, end = run(workflow, layout, cost, cluster, prepared=prepared, tasks=tasks,
                      residents=start, memory=memory, record=record)
    if end != start:
        result, _ = run(workflow, layout, cost, cluster, prepared=prepared, tasks=tasks,
                        residents=end, memory=memory, record=record)
    return result


@dataclass(frozen=True)
class _Prepared:
    """A component's calls and inputs, precomputed once per simulation."""

    comp: Component
    durations: list[float]
    edges: list[tuple[_Input, tuple[float, float]]]
    """Each input with its link: (bytes/s, seconds per message)."""
    steps: int
    atoms: tuple[int, ...]
    ndev: int
    switching_atoms: tuple[int, ...]
    """The component's atoms whose residents do not all fit together (empty for CPU ones)."""
    turn_free: frozenset[str] = frozenset()
    """The components after whose calls this one's take no turn (itself and the loop
    partners on its devices, which the runtime runs in its process)."""
    turn_atoms: tuple[int, ...] = ()
    """Its atoms that a component outside `turn_free` also runs on: the only ones taken
    through the device lock (alone on its devices, a component takes no turns)."""


_Residents = dict[int, tuple[str, ...]]
"""Per tracked atom: its residents, least recently used first."""


def _ready_time(
    prepared: Mapping[str, _Prepared], name: str, step: int, j: int, *,
    ends: Mapping[tuple[str, int], Sequence[float]],
    stream_time: Callable[[tuple[str, int], float], float | None],
) -> float | None:
    """When call j of (name, step) has its inputs; None while a producer call it needs is
    not placed yet. `ends` holds the placed calls' end times, `stream_time` when a
    streaming producer's step reached a fraction of its work (None: not yet known)."""
    ready = 0.0
    for inp, (bw, latency) in prepared[name].edges:
        if inp.rule == 4:
            continue  # last iteration's data, already in the consumer's channel
        if inp.rule == 0:
            src_step = step
        elif inp.rule == 1:
            if step == 0:
                continue
            src_step = step - 1
        elif inp.rule == 2:
            if step > 0:
                continue
            src_step = prepared[inp.src].steps - 1
        else:
            src_step = prepared[inp.src].steps - 1
        if inp.streaming:
            t = stream_time((inp.src, src_step), inp.fraction[j])
            if t is None:
                return None
        else:
            placed = ends.get((inp.src, src_step))
            if placed is None or len(placed) <= inp.index[j]:
                return None
            t = placed[inp.index[j]]
        if inp.nbytes[j] > 0:
            t += latency + inp.nbytes[j] / bw
        ready = max(ready, t)
    return ready


# Times closer than this are equal: two calls ready "at once" by different float sums tie,
# and ties go by dependency order in both schedules, never by rounding noise.
_EPS = 1e-9


def _run(
    workflow: Workflow, layout: Layout, cost: CostModel, cluster: Cluster, *,
    prepared: Mapping[str, _Prepared], tasks: Sequence[tuple[str, int]], residents: _Residents,
    memory: Mapping[str, int], record: bool,
) -> tuple[SimulationResult, _Residents]:
    residency = {a: Residency[str](layout.atom_memory[a],
                                   ((n, memory[n]) for n in residents.get(a, ())))
                 for a in {a for p in prepared.values() for a in p.switching_atoms}}
    free = [0.0] * len(layout.atoms)
    ends: dict[tuple[str, int], list[float]] = {}  # (component, step) → per-call end times
    streams: dict[tuple[str, int], tuple[float, float]] = {}  # streaming: (start, duration)
    busy: dict[str, float] = {n: 0.0 for n in workflow.names}
    switch_counts: dict[str, int] = {}
    device_seconds = switch_total = horizon = 0.0
    intervals: list[Interval] = []
    done_steps: dict[str, int] = {name: 0 for name in prepared}
    holder: list[str | None] = [None] * len(layout.atoms)  # each atom's last caller

    def stream_time(key: tuple[str, int], fraction: float) -> float | None:
        stream = streams.get(key)
        return None if stream is None else stream[0] + stream[1] * fraction

    def ready_time(name: str, step: int, j: int) -> float | None:
        return _ready_time(prepared, name, step, j, ends=ends, stream_time=stream_time)

    # List scheduling: repeatedly start the call that asks for its devices earliest, then
    # the one that can start earliest (ties: dependency order), so a device's idle gap goes
    # to whichever component has work ready, as the device lock grants turns; without gaps
    # each component keeps the device for its calls.
    active = list(range(len(tasks)))
    while active:
        best: tuple[float, int, float, float] | None = None  # start, task, switch start, sw
        for ti in active:
            name, step = tasks[ti]
            if done_steps[name] < step:
                continue  # its previous step is not placed yet
            j = len(ends.get((name, step), ()))
            ready = ready_time(name, step, j)
            if ready is None:
                continue
            prep = prepared[name]
            begin = max(ready, *(free[a] for a in prep.atoms))
            sw = 0.0
            if any(name not in residency[a] for a in prep.switching_atoms):
                sw = cost.switch_time(name)
            start = begin + sw + _turn(cluster, holder, prep, name)
            # The call that asks for its devices first gets them (the lock grants in request
            # order, and a call asks once its input is in hand and its devices are free);
            # of calls asking at once, the one that can start first. As in `_run_shared`.
            if best is None or begin < best[2] - _EPS or (
                    begin < best[2] + _EPS and start < best[0] - _EPS):
                best = (start, ti, begin, sw)
        if best is None:  # pragma: no cover - _schedule is a topological order
            raise PlanningError("the workflow's dependencies could not be scheduled")
        start, ti, begin, sw = best
        name, step = tasks[ti]
        prep = prepared[name]
        out = ends.setdefault((name, step), [])
        j = len(out)
        dur = prep.durations[j]
        switched = False
        for a in prep.switching_atoms:
            switched |= residency[a].admit(name, memory[name]).onload
        if switched:
            switch_counts[name] = switch_counts.get(name, 0) + 1
            switch_total += sw
            if record and sw > 0:
                intervals.append(Interval(name, _devices(layout, prep.atoms), begin, start,
                                          "switch", step, j))
        end = start + dur
        for a in prep.atoms:
            free[a] = end
            holder[a] = name
        busy[name] += dur
        device_seconds += dur * prep.ndev
        horizon = max(horizon, end)
        out.append(end)
        if record:
            intervals.append(Interval(name, _devices(layout, prep.atoms), start, end, "compute",
                                      step, j))
        if prep.comp.streaming:
            streams[(name, step)] = (start, dur)
        if len(out) == len(prep.durations):
            active.remove(ti)
            done_steps[name] = step + 1
    util = device_seconds / (cluster.num_devices * horizon) if horizon > 0 else 0.0
    result = SimulationResult(horizon, min(1.0, util), busy, switch_total, tuple(intervals),
                              switch_counts)
    return result, {a: r.resident for a, r in residency.items()}


def _turn(cluster: Cluster, holder: Sequence[str | None], prep: _Prepared,
          name: str) -> float:
    """The hand-over delay of a call of `name` (`prep`): `Cluster.turn_latency` when any of
    its atoms that it shares (`turn_atoms`) was last held by a component outside its process
    (or not yet held in this iteration), else 0."""
    if cluster.turn_latency and any(holder[a] not in prep.turn_free for a in prep.turn_atoms):
        return cluster.turn_latency
    return 0.0


def _turn_free(workflow: Workflow, layout: Layout, name: str) -> frozenset[str]:
    """`name` and the members of its loop placed on exactly its devices. (Components that
    share a process still hand their devices over through its in-process lock: a thread's
    wake-up, which the fitted `Cluster.turn_latency` prices with whatever else a hand-over
    costs where it is measured.)"""
    loop = workflow.loop_of(name)
    if loop is None:
        return frozenset((name,))
    mine = set(layout.comp_atoms[name])
    return frozenset(n for n in workflow.loops[loop].components
                     if set(layout.comp_atoms[n]) == mine)


def _process_partners(workflow: Workflow, layout: Layout, name: str) -> frozenset[str]:
    """The components the runtime runs in `name`'s worker processes (`rlinf.sched.
    process_sets`): those on exactly its devices with as many processes, neither isolated."""
    isolated = {c.name for c in workflow.components if c.isolated}
    if name in isolated:
        return frozenset((name,))
    mine, procs = layout.comp_sets.get(name), layout.comp_procs.get(name, 1)
    return frozenset(n for n, atoms in layout.comp_sets.items()
                     if n == name or (n not in isolated and atoms == mine
                                      and layout.comp_procs.get(n, 1) == procs))


@dataclass
class _Call:
    """A call in flight in `_run_shared`: switching until `compute_start`, then computing
    its `work` (profiled seconds) at the rate the node's core sharing allows."""

    task: int
    name: str
    step: int
    begin: float
    compute_start: float
    work: float
    remaining: float
    rate: float = 1.0

    @property
    def done(self) -> float:
        """Fraction of its work done."""
        return 1.0 - self.remaining / self.work if self.work > 0 else 1.0


def _run_shared(
    workflow: Workflow, layout: Layout, cost: CostModel, cluster: Cluster, *,
    prepared: Mapping[str, _Prepared], tasks: Sequence[tuple[str, int]], residents: _Residents,
    memory: Mapping[str, int], record: bool, sharing: CoreSharing,
    threads: Mapping[str, Mapping[int, int]],
) -> tuple[SimulationResult, _Residents]:
    """`_run` where calls on CPU slots share their node's cores (`rlinf.sched.core_sharing`):
    a call's duration depends on what computes beside it, so time advances event by event
    (a call starts, finishes, or a stream reaches a fraction a consumer waits for) instead of
    placing each call with a known end. The schedule is the same list schedule: at each
    moment the calls whose inputs are in and whose devices are free start, one without a
    switch before one with, then in dependency order; with every rate at 1 both agree."""
    residency = {a: Residency[str](layout.atom_memory[a],
                                   ((n, memory[n]) for n in residents.get(a, ())))
                 for a in {a for p in prepared.values() for a in p.switching_atoms}}
    ends: dict[tuple[str, int], list[float]] = {}
    marks: dict[tuple[str, int], list[tuple[float, float]]] = {}  # stream: (time, done)
    busy: dict[str, float] = {n: 0.0 for n in workflow.names}
    switch_counts: dict[str, int] = {}
    device_seconds = switch_total = horizon = 0.0
    intervals: list[Interval] = []
    done_steps: dict[str, int] = {name: 0 for name in prepared}
    awaited: dict[str, list[float]] = {}  # streaming component → fractions consumers wait for
    for p in prepared.values():
        for inp, _ in p.edges:
            if inp.streaming:
                awaited.setdefault(inp.src, []).extend(inp.fraction)
    awaited = {k: sorted(set(v)) for k, v in awaited.items()}

    def stream_time(key: tuple[str, int], fraction: float) -> float | None:
        points = marks.get(key)
        if not points:
            return None
        t0, p0 = points[0]
        if p0 >= fraction - _EPS:
            return t0
        for t1, p1 in points[1:]:
            if p1 >= fraction - _EPS:
                return t1 if p1 <= p0 else t0 + (t1 - t0) * (fraction - p0) / (p1 - p0)
            t0, p0 = t1, p1
        return None

    def ready_time(name: str, step: int, j: int) -> float | None:
        return _ready_time(prepared, name, step, j, ends=ends, stream_time=stream_time)

    busy_atoms: set[int] = set()
    holder: list[str | None] = [None] * len(layout.atoms)  # each atom's last caller
    running: list[_Call] = []
    active = list(range(len(tasks)))
    now = 0.0

    def ready_times() -> dict[int, float | None]:
        """When each active task whose step may run has its next call's inputs."""
        out: dict[int, float | None] = {}
        for ti in active:
            name, step = tasks[ti]
            if done_steps[name] >= step:
                out[ti] = ready_time(name, step, len(ends.get((name, step), ())))
        return out

    while active:
        # Start every call that can start now. Starting a call changes no task's inputs,
        # except a stream's first mark: the ready times are taken again after one.
        readiness = ready_times()
        in_flight = {(c.name, c.step) for c in running}
        while True:
            candidates: list[tuple[float, float, int]] = []  # (delay, switch, task)
            for ti, ready in readiness.items():
                if ready is None or ready > now + _EPS:
                    continue
                name, step = tasks[ti]
                prep = prepared[name]
                if (name, step) in in_flight or any(a in busy_atoms for a in prep.atoms):
                    continue
                switching = any(name not in residency[a] for a in prep.switching_atoms)
                sw = cost.switch_time(name) if switching else 0.0
                candidates.append((sw + _turn(cluster, holder, prep, name), sw, ti))
            if not candidates:
                break
            delay, sw, ti = min(candidates)
            name, step = tasks[ti]
            prep = prepared[name]
            j = len(ends.get((name, step), ()))
            switched = False
            for a in prep.switching_atoms:
                switched |= residency[a].admit(name, memory[name]).onload
            if switched:
                switch_counts[name] = switch_counts.get(name, 0) + 1
                switch_total += sw
                if record and sw > 0:
                    intervals.append(Interval(name, _devices(layout, prep.atoms), now, now + sw,
                                              "switch", step, j))
            work = prep.durations[j]
            running.append(_Call(ti, name, step, now, now + delay, work, work))
            busy_atoms.update(prep.atoms)
            in_flight.add((name, step))
            for a in prep.atoms:
                holder[a] = name
            if prep.comp.streaming:
                marks[(name, step)] = [(now + delay, 0.0)]
                readiness = ready_times()
        # Rates of the calls computing now; the next event.
        computing: dict[int, int] = {}
        for c in running:
            if c.compute_start <= now + _EPS:
                for node, k in threads[c.name].items():
                    computing[node] = computing.get(node, 0) + k
        upcoming: list[float] = []
        for c in running:
            if c.compute_start > now + _EPS:
                upcoming.append(c.compute_start)
                continue
            c.rate = sharing.rate(threads[c.name], computing)
            upcoming.append(now + c.remaining / c.rate)
            for fraction in awaited.get(c.name, ()):
                if fraction > c.done + _EPS:
                    upcoming.append(now + (fraction - c.done) * c.work / c.rate)
                    break
        upcoming.extend(ready for ready in readiness.values()
                        if ready is not None and ready > now + _EPS)
        if not upcoming:  # pragma: no cover - _schedule is a topological order
            raise PlanningError("the workflow's dependencies could not be scheduled")
        later = min(upcoming)
        # Advance to it: progress, stream marks, finished calls.
        for c in list(running):
            if c.compute_start > now + _EPS:
                continue
            c.remaining = max(0.0, c.remaining - c.rate * (later - now))
            finished = c.remaining <= _EPS * max(1.0, c.work)
            if (c.name, c.step) in marks:
                marks[(c.name, c.step)].append((later, 1.0 if finished else c.done))
            if not finished:
                continue
            running.remove(c)
            prep = prepared[c.name]
            busy_atoms.difference_update(prep.atoms)
            out = ends.setdefault((c.name, c.step), [])
            wall = later - c.compute_start
            busy[c.name] += wall
            device_seconds += wall * prep.ndev
            horizon = max(horizon, later)
            if record:
                intervals.append(Interval(c.name, _devices(layout, prep.atoms), c.compute_start,
                                          later, "compute", c.step, len(out)))
            out.append(later)
            if len(out) == len(prep.durations):
                active.remove(c.task)
                done_steps[c.name] = c.step + 1
        now = later
    util = device_seconds / (cluster.num_devices * horizon) if horizon > 0 else 0.0
    result = SimulationResult(horizon, min(1.0, util), busy, switch_total, tuple(intervals),
                              switch_counts)
    return result, {a: r.resident for a, r in residency.items()}


def _replayed_residents(
    layout: Layout, tasks: Sequence[tuple[str, int]], prepared: Mapping[str, _Prepared],
    tracked: Iterable[int], memory: Mapping[str, int],
) -> _Residents:
    """Residents after admitting the calls in dependency order twice (a steady-state guess)."""
    residency = {a: Residency[str](layout.atom_memory[a]) for a in tracked}
    for _ in range(2):
        for name, _step in tasks:
            for a in prepared[name].switching_atoms:
                residency[a].admit(name, memory[name])
    return {a: r.resident for a, r in residency.items()}


def _schedule(workflow: Workflow) -> Iterable[tuple[str, int]]:
    """(component, step) pairs in dependency order; loop members repeat step by step."""
    order = workflow.order
    i = 0
    while i < len(order):
        loop = workflow.loop_of(order[i])
        if loop is None:
            yield order[i], 0
            i += 1
            continue
        members = [n for n in order if workflow.loop_of(n) == loop]
        for step in range(workflow.loops[loop].steps):
            for n in members:
                yield n, step
        i += len(members)


def _link(workflow: Workflow, layout: Layout, cluster: Cluster, src: str, dst: str
          ) -> tuple[float, float]:
    """(bytes/s, seconds per message) from `src` to `dst`: every message between processes
    pays the cluster's `message_latency` (a hop), one within a process (components that
    share it, `_process_partners`) nothing; on the same device set the bytes move for free,
    else over ``min(|src devices|, |dst devices|)`` parallel links of the node's (or the
    inter-node) bandwidth, each message paying the link's latency once more."""
    if layout.comp_sets.get(src) == layout.comp_sets.get(dst):
        # In one process only where each end has one: with several ranks a producer's
        # items also reach consumer ranks in the other processes of the set.
        if (layout.comp_devices[src] == layout.comp_devices[dst] == 1
                and layout.comp_procs.get(src, 1) == layout.comp_procs.get(dst, 1) == 1
                and dst in _process_partners(workflow, layout, src)):
            return math.inf, 0.0
        return math.inf, cluster.message_latency
    links = min(layout.comp_devices[src], layout.comp_devices[dst])
    same_node = layout.comp_node[src] is not None and layout.comp_node[src] == layout.comp_node[dst]
    if same_node:
        return (cluster.intra_node_bandwidth * links,
                cluster.intra_node_latency + cluster.message_latency)
    return (cluster.inter_node_bandwidth * links,
            cluster.inter_node_latency + cluster.message_latency)


def _memory(
    workflow: Workflow, layout: Layout, cost: CostModel, sizes: Mapping[str, int]
) -> dict[str, int]:
    """Bytes per device of each component at its micro-batch (0 for CPU components);
    refuses a component that does not fit its devices alone."""
    memory: dict[str, int] = {}
    for c in workflow.components:
        if c.resource != "gpu":
            memory[c.name] = 0
            continue
        mem = cost.memory(c.name, batch_size=sizes[c.name], num_devices=layout.comp_devices[c.name])
        for a in layout.comp_atoms[c.name]:
            if mem > layout.atom_memory[a]:
                raise PlanningError(
                    f"component {c.name!r} needs {mem} bytes per device on "
                    f"{layout.comp_devices[c.name]} device(s) with micro-batch {sizes[c.name]}, "
                    f"but its devices have {layout.atom_memory[a]}: give it more devices or a "
                    "smaller micro-batch"
                )
        memory[c.name] = mem
    return memory


def _tracked_atoms(workflow: Workflow, layout: Layout, memory: Mapping[str, int]) -> set[int]:
    """Atoms whose GPU components do not all fit together: the only ones that ever switch."""
    members: list[dict[str, int | None]] = [{} for _ in layout.atoms]
    for c in workflow.components:
        for a in layout.comp_atoms[c.name]:
            members[a][c.name] = memory[c.name]
    return {a for a, sizes in enumerate(members)
            if not Residency[str](layout.atom_memory[a]).fits_together(sizes)}


def _devices(layout: Layout, atoms: Sequence[int]) -> tuple[int, ...]:
    if layout.device_lists:
        return tuple(sorted(d for a in atoms for d in layout.device_lists[a]))
    return tuple(sorted(d for a in atoms for d in range(layout.atoms[a][0],
                                                          layout.atoms[a][0] + layout.atoms[a][1])))
