"""``auto``: profile the declared flow, fit cost curves, plan, launch the best plan.

`profile_flow` launches short probe runs of the flow collocated on the first n devices,
for each device count n (1 and all of the cluster's devices by default, so the fit can tell
a component's parallel part from its fixed and collective parts), and times an iteration at
each batch size after a discarded warm-up iteration at that size; what it measures is what
`FlowRun.profile` records (busy time, peak memory, onloads and offloads per component).
Probe runs train throw-away copies and are closed before the real run starts, so the run's
trajectory is the same as with a fixed placement. The probes also record their weight
syncs, their own iterations and, on CPU slots, a pipelined probe's iterations
(`pipeline_probe_spec`), to which `calibrated_cluster` fits the cluster's turn latency
(collocated probes: components take turns on every device) and message latency (the
pipelined probe: hops between processes, cores shared side by side). `plan_flow` prices
``MacroFlow.to_sched_workflow()``'s plans as the apps do (`rlinf.workers.training.Pricing`:
the profile fitted, the cluster calibrated, the M2Flow planner's ranked plans priced again
as the flow runs them); `launch_auto`
launches the best one and returns an `AutoReport` whose `predicted_seconds` the caller
compares with the measured iterations (`AutoReport.compare`).
"""

from __future__ import annotations

import dataclasses
import math
import statistics
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import structlog

from rlinf.sched import (
    Cluster,
    CoreSharing,
    ExecutionMode,
    ExecutionPlan,
    Measurement,
    PlannerOptions,
    PlanProgress,
    PlanResult,
    Profile,
    Profiler,
    ProgressCallback,
)
from rlinf.workers.errors import ConfigError
from rlinf.workers.flow.declaration import MacroFlow
from rlinf.workers.flow.records import IterationRecord
from rlinf.workers.flow.run import FlowRun
from rlinf.workers.runtime.backend import start_runtime

__all__ = [
    "COLLOCATED_ITERATION",
    "COLLOCATED_PLANS",
    "CONTROL",
    "PROBE_ITERATION",
    "PROBE_PLAN",
    "PROFILE_FORMAT",
    "WEIGHT_SYNC",
    "AutoReport",
    "ProbeRun",
    "ProbeSimulation",
    "calibrated_cluster",
    "collocated_probes",
    "fit_latency",
    "fit_turn_latency",
    "iteration_overhead",
    "launch_auto",
    "merge_run_profiles",
    "overhead_seconds",
    "pipeline_probe",
    "pipeline_probe_spec",
    "plan_flow",
    "probe_iterations",
    "profile_device_counts",
    "profile_flow",
    "run_profile",
]

_log = structlog.get_logger(__name__)


@dataclass(frozen=True)
class AutoReport:
    """How `launch_auto` chose the plan it launched."""

    plan: ExecutionPlan
    """The launched plan (the planner's best)."""
    ranked: PlanResult
    """Every ranked plan and the best collocated and disaggregated baselines."""
    profile: Profile
    """The measurements the cost curves were fitted to."""
    profile_seconds: float
    """Wall time spent profiling (probe launches included)."""

    @property
    def predicted_seconds(self) -> float:
        """The simulated seconds per iteration of `plan` (weight sync not included)."""
        return self.plan.predicted_time

    def compare(self, records: Sequence[IterationRecord]) -> dict[str, float]:
        """Predicted against measured seconds per iteration: the median over `records` of
        the whole iteration and of its dataflow part (what the simulator models), and the
        relative error of the latter."""
        if not records:
            raise ConfigError("compare needs at least one iteration record")
        measured = statistics.median(r.seconds for r in records)
        dataflow = statistics.median(r.metrics["time/dataflow"] for r in records)
        predicted = self.predicted_seconds
        return {"predicted_s": predicted, "measured_s": measured,
                "measured_dataflow_s": dataflow,
                "relative_error": abs(predicted - dataflow) / dataflow if dataflow > 0
                else math.inf}


def profile_flow(flow: MacroFlow, cluster: Cluster, *, batch_sizes: Sequence[int],
                 device_counts: Sequence[int] | None = None, repeats: int = 5,
                 timeout: float = 600.0, pipeline_probe: bool = True,
                 inputs: Mapping[str, Mapping[str, Any]] | None = None) -> Profile:
    """Measure every component of `flow` `repeats` times at each of `batch_sizes` (global
    batch, items; the sizes interleaved, so a slow spell of a shared machine hits each
    once; the fit takes each point's median) on each of `device_counts` devices (default:
    1 and every device of `cluster`), and with `pipeline_probe` run the pipelined probe
    where it measures something (`pipeline_probe_spec`; a caller pricing only collocated
    plans can skip it). `inputs` go to every probe's launch (`FlowRun.launch`)."""
    if repeats < 1:
        raise ConfigError(f"repeats must be >= 1, got {repeats}")
    sizes = sorted(set(batch_sizes))
    counts = sorted(set(device_counts or profile_device_counts(flow, cluster)))
    if not sizes or min(sizes) < 1:
        raise ConfigError(f"batch_sizes must be >= 1 items, got {list(batch_sizes)}")
    if not counts or counts[0] < 1 or counts[-1] > cluster.num_devices:
        raise ConfigError(f"device_counts must lie in 1..{cluster.num_devices} (the cluster's "
                          f"devices), got {list(device_counts or ())}")
    unfit = [n for n in counts if not _runs_collocated(flow, n)]
    if unfit:
        raise ConfigError(f"device_counts {unfit}: some component of {flow.name!r} cannot run "
                          f"on that many devices (its device_multiple or min_devices); "
                          f"profile_device_counts gives counts every component runs on")
    profile = Profile(metadata={"flow": flow.name, "batch_sizes": sizes, "device_counts": counts})
    names = ",".join(flow.names)
    plans: dict[str, dict[str, object]] = {}
    for n in counts:
        probe = flow.fixed_plan(f"{names}: 0-{n - 1}", num_devices=cluster.num_devices)
        with FlowRun.launch(flow, probe, cluster=cluster, timeout=timeout,
                            inputs=inputs) as run:
            # One discarded step at every size: connections and first kernels, and an engine
            # such as vLLM prepares each new batch shape on its first call (seconds on CPU, which
            # a single warm-up at the smallest size left in the largest size's measurement).
            for i, size in enumerate(sizes * (1 + repeats)):
                run.step(i, global_batch=size)
            measured = run.records[len(sizes):]
            profile = profile.merge(run.profile(skip=len(sizes)), _overheads(measured),
                                    _iterations(COLLOCATED_ITERATION, measured,
                                                sizes * repeats, num_devices=n))
        plans[str(n)] = probe.to_dict()
        _log.info("flow_profiled", flow=flow.name, devices=n, sizes=sizes)
    profile = profile.merge(Profile(metadata={COLLOCATED_PLANS: plans}))
    split = pipeline_probe_spec(flow, cluster) if pipeline_probe else None
    if split is not None:
        profile = profile.merge(_pipeline_probe(flow, cluster, split, max(sizes), timeout,
                                                inputs=inputs))
    return profile


def profile_device_counts(flow: MacroFlow, cluster: Cluster) -> list[int]:
    """The device counts `profile_flow` probes by default: 1 and every device of `cluster`,
    each raised to the fewest devices on which every component can run collocated (a
    trainer cut by tensor and pipeline parallelism needs a multiple of its cut).
    ConfigError when no count up to the cluster's size does."""
    fits = [n for n in range(1, cluster.num_devices + 1) if _runs_collocated(flow, n)]
    if not fits:
        raise ConfigError(f"no device count in 1..{cluster.num_devices} runs every component "
                          f"of {flow.name!r} (device_multiple, min_devices, max_devices): "
                          "give the cluster more devices or the components smaller cuts")
    counts = {min((n for n in fits if n >= want), default=fits[-1])
              for want in (1, cluster.num_devices)}
    return sorted(counts)


def _runs_collocated(flow: MacroFlow, devices: int) -> bool:
    """Whether every component of `flow` can run on `devices` devices."""
    return all(spec.component.allows(devices) for spec in flow.components)


_PROBE_WARMUPS = 2
_PROBE_ITERATIONS = 5
"""Discarded and measured iterations of the pipelined probe; `calibrated_cluster` fits the
median of the measured ones. On a small box the first iterations of a fresh launch run
slow, falling iteration by iteration, and now and then one runs slow at random, so a single
warm-up and a median of three fitted the latency to a slow spell."""
PROFILE_FORMAT = 4
"""What a profile records, raised whenever it records something new that the fit reads (2:
the collocated probes' iterations, `COLLOCATED_ITERATION`; 3: runs' own measurements with
their timed calls, `run_profile`; 4: a loop's components per loop step); part of a cached
profile's identity, so a profile cached without it is measured again."""
CONTROL = "control"
"""Profile entries of what an iteration spends besides its dataflow and weight syncs: the
driver's calls to every component and its waits (`run_profile`)."""
COLLOCATED_ITERATION = "collocated_iteration"
"""Profile entries of the collocated probes: measured dataflow seconds of each iteration,
at its batch size (items) on the probe's device count (`collocated_probes`)."""
COLLOCATED_PLANS = "collocated_probe_plans"
"""Profile metadata key of the collocated probes' plans (`ExecutionPlan.to_dict`), keyed by
device count (a string)."""
PROBE_ITERATION = "probe_iteration"
"""Profile entries of the pipelined probe: its measured dataflow seconds per iteration
(the plan it ran is the profile's ``probe_plan`` metadata)."""
PROBE_PLAN = "probe_plan"
"""Profile metadata key of the plan (`ExecutionPlan.to_dict`) the pipelined probe ran."""
WEIGHT_SYNC = "weight_sync"
"""Profile entries of the probes' weight syncs (seconds each), paid by every plan."""


@dataclass(frozen=True)
class ProbeRun:
    """What a profile recorded of a probe that ran real iterations of a plan."""

    plan: ExecutionPlan
    """The plan the probe ran."""
    batch_size: int
    """Items per iteration it ran."""
    seconds: float
    """Median measured seconds per iteration."""


def collocated_probes(profile: Profile) -> tuple[ProbeRun, ...]:
    """Each collocated probe of `profile` at each batch size it ran (`COLLOCATED_ITERATION`
    entries and `COLLOCATED_PLANS` metadata), by device count then size; empty without
    them (a profile cached before they were recorded)."""
    stored = profile.metadata.get(COLLOCATED_PLANS)
    if not isinstance(stored, dict):
        return ()
    probes: list[ProbeRun] = []
    for count, plan_dict in sorted(stored.items(), key=lambda item: int(item[0])):
        at: dict[int, list[float]] = {}
        for m in profile.measurements:
            if m.component == COLLOCATED_ITERATION and m.num_devices == int(count):
                at.setdefault(m.batch_size, []).append(m.seconds)
        plan_ = ExecutionPlan.from_dict(plan_dict)
        probes.extend(ProbeRun(plan_, size, statistics.median(seconds))
                      for size, seconds in sorted(at.items()))
    return tuple(probes)


def pipeline_probe(profile: Profile) -> ProbeRun | None:
    """The probe in `profile` (`PROBE_ITERATION` entries and `PROBE_PLAN` metadata), or
    None without one (a GPU cluster, no probe asked for, a profile cached before)."""
    measured = [m for m in profile.measurements if m.component == PROBE_ITERATION]
    stored = profile.metadata.get(PROBE_PLAN)
    if not measured or not isinstance(stored, dict):
        return None
    return ProbeRun(ExecutionPlan.from_dict(stored), measured[0].batch_size,
                    statistics.median(m.seconds for m in measured))


def overhead_seconds(profile: Profile, components: Sequence[str] = (WEIGHT_SYNC,)) -> float:
    """Seconds every plan pays per iteration beside the dataflow the simulator models: the
    sum over `components` of the median of their entries in `profile` (0 for one without)."""
    total = 0.0
    for name in components:
        seconds = [m.seconds for m in profile.measurements if m.component == name]
        total += statistics.median(seconds) if seconds else 0.0
    return total


def fit_latency(low: float, target: float, seconds_at: Callable[[float], float]) -> float:
    """A per-message latency, never below `low`, at which `seconds_at` (a simulated probe
    iteration) reaches `target` (its measured seconds); `low` when it already does. By
    bisection: list scheduling is not monotone in the latency, so the latency found is one
    at which the simulation matches, not necessarily the least. `low` too when no latency
    up to `target` seconds per message reaches it (a probe that sends no messages): the
    gap is not the link's, and a latency of that size would price every message-sending
    plan out."""
    if target <= 0 or seconds_at(low) >= target:
        return low
    high = max(2 * low, 1e-4)
    while seconds_at(high) < target and high < target:
        high *= 2
    if seconds_at(high) < target:
        return low
    for _ in range(30):
        middle = (low + high) / 2
        low, high = (middle, high) if seconds_at(middle) < target else (low, middle)
    return high


def pipeline_probe_spec(flow: MacroFlow, cluster: Cluster) -> str | None:
    """The placement of the pipelined probe, or None when there is nothing for it to
    measure: the first component on device 0, the others collocated on device 1, so
    components compute beside each other and every message is a hop between processes,
    as in a pipelined plan (collocated probes hide both: one component computes at a time
    and a hop overlaps the producer's next call). Two devices whatever the cluster's size,
    so the probe shares no core more than a plan would. Only on clusters of CPU slots with
    a known core count, where those hops and the shared cores decide how fast a pipelined
    plan runs."""
    probe_cluster = dataclasses.replace(cluster, cpu_background=1.0)
    if len(flow.names) < 2 or cluster.num_devices < 2 or CoreSharing.of(probe_cluster) is None:
        return None
    if not all(spec.component.allows(1) for spec in flow.components):
        return None  # a component that needs more than one device (a cut trainer)
    return f"{flow.names[0]}: 0, {','.join(flow.names[1:])}: 1"


def _pipeline_probe(flow: MacroFlow, cluster: Cluster, spec: str, size: int,
                    timeout: float, *, inputs: Mapping[str, Mapping[str, Any]] | None = None
                    ) -> Profile:
    """`_PROBE_WARMUPS` discarded and `_PROBE_ITERATIONS` measured iterations at `size` of
    the pipelined probe `spec`."""
    probe = flow.fixed_plan(spec, num_devices=cluster.num_devices)
    with FlowRun.launch(flow, probe, cluster=cluster, timeout=timeout, inputs=inputs) as run:
        for i in range(_PROBE_WARMUPS + _PROBE_ITERATIONS):
            run.step(i, global_batch=size)
        measured = run.records[_PROBE_WARMUPS:]
    _log.info("flow_pipeline_probed", flow=flow.name, plan=spec, size=size)
    iterations = _iterations(PROBE_ITERATION, measured, [size] * len(measured),
                             num_devices=cluster.num_devices)
    return Profile(iterations.measurements, metadata={PROBE_PLAN: probe.to_dict()})


def _iterations(component: str, records: Sequence[IterationRecord], sizes: Sequence[int], *,
                num_devices: int) -> Profile:
    """The dataflow seconds of `records` (run at `sizes`, items) as `component` entries."""
    profiler = Profiler(track_memory=False)
    for record, size in zip(records, sizes, strict=True):
        profiler.record(Measurement(
            component=component, batch_size=size, num_devices=num_devices,
            seconds=record.metrics["time/dataflow"], peak_memory_bytes=0,
            memory_source="none", timestamp=0.0))
    return profiler.profile


def _overheads(records: Sequence[IterationRecord]) -> Profile:
    """The weight syncs of `records` as `WEIGHT_SYNC` entries, and what each iteration
    spent besides its dataflow and syncs (the driver's calls and waits) as `CONTROL`."""
    profiler = Profiler(track_memory=False)

    def entry(component: str, seconds: float) -> Measurement:
        return Measurement(component=component, batch_size=1, num_devices=1, seconds=seconds,
                           peak_memory_bytes=0, memory_source="none", timestamp=0.0)

    for record in records:
        syncs = [phase.seconds for phase in record.phases if not phase.is_component]
        for seconds in syncs:
            profiler.record(entry(WEIGHT_SYNC, seconds))
        dataflow = record.metrics.get("time/dataflow", 0.0)
        profiler.record(entry(CONTROL, max(0.0, record.seconds - dataflow - sum(syncs))))
    return profiler.profile


def probe_iterations(run: FlowRun, *, items: int, iterations: int, collocated: bool,
                     budget_s: float = 3.0, most: int = 9) -> Profile:
    """Real iterations of a throw-away `run` as profile entries: `iterations`, the first a
    warm-up, then more while they have taken under `budget_s` in all, up to `most` (one
    slow iteration among two moves a fit; a simulator's iteration may take seconds, another
    a tenth of one). Each is drained (a synchronous iteration, as the planner prices it) and
    recorded by its dataflow seconds (weight sync and control aside), with the plan in the
    metadata: `COLLOCATED_ITERATION` entries where no message crosses between processes
    (`collocated`: their median prices the devices' hand-overs), else the median as the
    `PROBE_ITERATION` (it prices the messages between processes)."""
    seconds: list[float] = []
    started = time.perf_counter()
    while len(seconds) < iterations or (
            len(seconds) < most and time.perf_counter() - started < budget_s):
        records = run.iteration(len(seconds) + 1, drain=True)
        seconds.append(sum(r.metrics["time/dataflow"] for r in records))
    seconds, now = seconds[1:], time.time()
    if not collocated:
        return Profile((Measurement(PROBE_ITERATION, items, 1, statistics.median(seconds), 0,
                                    memory_source="none", timestamp=now),),
                       metadata={PROBE_PLAN: run.plan.to_dict()})
    devices = run.plan.placement.num_devices
    return Profile(tuple(Measurement(COLLOCATED_ITERATION, items, devices, s, 0,
                                     memory_source="none", timestamp=now) for s in seconds),
                   metadata={COLLOCATED_PLANS: {str(devices): run.plan.to_dict()}})


def iteration_overhead(run: FlowRun, *, repeats: int, timeout: float) -> Profile:
    """What every iteration of `run` pays besides the dataflow the simulator models:
    `WEIGHT_SYNC` (the runtime's sync, unchanged weights) and `CONTROL` (the driver's round
    trips to every role: an iteration's entry calls and the device-lock count), medians of
    `repeats` each."""
    syncs = [run.sync_weights() for _ in range(max(repeats, 1))]
    trips = []
    for _ in range(max(repeats, 1)):
        started = time.perf_counter()
        futures = [g.call_async("worker_info") for g in run.groups.values()]
        for future in futures:
            future.rank_results(timeout=timeout)
        trips.append(time.perf_counter() - started)
    now = time.time()
    return Profile((Measurement(WEIGHT_SYNC, 1, 1, statistics.median(syncs), 0,
                                memory_source="none", timestamp=now),
                    Measurement(CONTROL, 1, 1, 2 * statistics.median(trips), 0,
                                memory_source="none", timestamp=now)))


def run_profile(run: FlowRun, *, skip: int = 1) -> Profile:
    """What a running flow measured of itself, in the form `profile_flow` records: every
    component's measurements of the iterations after the first `skip` (warm-up), their
    weight syncs, and the iterations themselves as a probe of the plan they ran — a
    collocated plan's as `COLLOCATED_ITERATION` entries, any other's as the pipelined probe
    (`PROBE_ITERATION`) — so that `calibrated_cluster` fits the cluster's latencies to them.
    Measured beside the real iterations instead of before them: profiling that never delays
    a run (and, cached, prices the next run of the same workflow before it starts)."""
    records = run.records[skip:]
    if not records:
        raise ConfigError(f"the run has {len(run.records)} iteration(s): a profile needs one "
                          f"more than the {skip} skipped")
    plan_ = run.plan
    sizes = [run.flow.batch] * len(records)
    profile = run.profile(skip=skip).merge(_overheads(records))
    if plan_.mode is ExecutionMode.COLLOCATED:
        count = len(plan_.placement.used_devices)
        return profile.merge(_iterations(COLLOCATED_ITERATION, records, sizes,
                                         num_devices=count),
                             Profile(metadata={COLLOCATED_PLANS: {str(count): plan_.to_dict()}}))
    iterations = _iterations(PROBE_ITERATION, records, sizes,
                             num_devices=plan_.placement.num_devices)
    return profile.merge(iterations, Profile(metadata={PROBE_PLAN: plan_.to_dict()}))


_KEEP_PER_POINT = 16
"""Measurements kept per component and (batch, devices) point when runs add to a cached
profile: the fit takes each point's median, and the newest runs say what things cost now."""


def merge_run_profiles(cached: Profile | None, measured: Profile) -> Profile:
    """A cached profile with what another run `measured` (`run_profile`) added: the
    collocated probes' plans of both, the newest pipelined probe (its entries replace an
    older probe's of another plan), and at most `_KEEP_PER_POINT` measurements (the newest)
    per component and point, so a profile that every run extends stays small."""
    if cached is None:
        return measured
    plans = {**dict(cached.metadata.get(COLLOCATED_PLANS) or {}),
             **dict(measured.metadata.get(COLLOCATED_PLANS) or {})}
    old = list(cached.measurements)
    if measured.metadata.get(PROBE_PLAN) not in (None, cached.metadata.get(PROBE_PLAN)):
        old = [m for m in old if m.component != PROBE_ITERATION]
    kept: dict[tuple[str, int, int], list[Measurement]] = {}
    for m in (*old, *measured.measurements):
        kept.setdefault((m.component, m.batch_size, m.num_devices), []).append(m)
    measurements = tuple(m for ms in kept.values() for m in ms[-_KEEP_PER_POINT:])
    metadata = {**cached.metadata, **measured.metadata}
    if plans:
        metadata[COLLOCATED_PLANS] = plans
    switches = (*cached.switches, *measured.switches)[-4 * _KEEP_PER_POINT:]
    return Profile(measurements, switches, metadata)


ProbeSimulation = Callable[[ExecutionPlan, int, Cluster], float]
"""Simulated seconds of a probe plan at a global batch (items) on a cluster."""


def calibrated_cluster(cluster: Cluster, profile: Profile,
                       simulated: ProbeSimulation) -> Cluster:
    """`cluster` fitted to the probes' measured iterations, in two steps (each by bisection,
    never lowered, unchanged without the probes in `profile`):

    1. `Cluster.turn_latency`: for each collocated probe and size (`collocated_probes`)
       the latency at which `simulated` matches what it measured, and the median of those:
       there every component takes turns on every device, and each hand-over (the lock's
       release and grant, the next holder's wake-up with its input) idles them.
    2. `Cluster.message_latency` until `simulated` of the pipelined probe
       (`pipeline_probe_spec`) matches its measured seconds: collocated probes hide each hop
       between processes behind the producer's next call and compute one component at a
       time; a pipelined plan pays the hops (a channel put, a get and a wake-up per message)
       on its critical path, with components sharing the cores, and the latency absorbs
       both (a GPU cluster, `pipeline_probe=False` or a profile cached before has none).

    List scheduling is not monotone in either latency, so the value found is one at which
    the simulation matches, not necessarily the least."""
    cluster = fit_turn_latency(cluster, profile, simulated)
    probe = pipeline_probe(profile)
    if probe is None:
        return cluster
    latency = fit_latency(cluster.message_latency, probe.seconds, lambda latency: simulated(
        probe.plan, probe.batch_size, dataclasses.replace(cluster, message_latency=latency)))
    if latency == cluster.message_latency:
        return cluster
    _log.info("message_latency_fitted", latency_s=latency, probe=probe.plan.spec,
              measured_s=probe.seconds)
    return dataclasses.replace(cluster, message_latency=latency)


def fit_turn_latency(cluster: Cluster, profile: Profile,
                     simulated: ProbeSimulation) -> Cluster:
    """Step 1 of `calibrated_cluster`: `cluster` with the turn latency at which `simulated`
    matches each collocated probe of `profile` (`collocated_probes`), the median over probes
    and sizes; unchanged without them, never lowered."""
    probes = collocated_probes(profile)
    if not probes:
        return cluster

    def fitted(probe: ProbeRun) -> float:
        return fit_latency(cluster.turn_latency, probe.seconds, lambda turn: simulated(
            probe.plan, probe.batch_size, dataclasses.replace(cluster, turn_latency=turn)))

    # One fit per probe and size, and their median: a probe point whose iterations mostly
    # stalled (measured far above what its components computed, while the other points sat
    # just over theirs) moves a sum, not the median.
    fits = [fitted(probe) for probe in probes]
    turn = max(cluster.turn_latency, statistics.median(fits))
    if turn == cluster.turn_latency:
        return cluster
    _log.info("turn_latency_fitted", latency_s=turn, fits=fits)
    return dataclasses.replace(cluster, turn_latency=turn)


def plan_flow(flow: MacroFlow, profile: Profile, cluster: Cluster, *,
              options: PlannerOptions | None = None,
              progress: ProgressCallback | None = None) -> PlanResult:
    """Ranked plans of `flow` on `cluster`, the best first, priced as the apps price theirs
    (`rlinf.workers.training.Pricing`: costs fitted to `profile`, the cluster calibrated to
    its probes, every iteration's weight sync on top). `progress` is called every few
    seconds of a long search (default: a ``flow_planning`` log line);
    ``options.exact_seconds`` bounds the exact pass."""
    # The training layer sits above the flow runtime: imported when planning.
    from rlinf.workers.training.pricing import Pricing

    choice = Pricing(flow.to_sched_workflow()).rank(
        profile, cluster, options=options, progress=progress or _log_progress)
    if choice.ranked is None:  # rank always ranks; a guard for the type
        raise ConfigError(f"no plan of {flow.name!r} was ranked")
    return choice.ranked


def _log_progress(progress: PlanProgress) -> None:
    _log.info("flow_planning", phase=progress.phase, simulations=progress.simulations,
              seconds=round(progress.seconds, 1), best_s=progress.best)


def launch_auto(flow: MacroFlow, cluster: Cluster, *, batch_sizes: Sequence[int],
                device_counts: Sequence[int] | None = None,
                options: PlannerOptions | None = None, timeout: float = 600.0,
                inputs: Mapping[str, Mapping[str, Any]] | None = None,
                trace: bool = False) -> tuple[FlowRun, AutoReport]:
    """Profile, fit, plan, and launch the best plan (see the module docstring); `inputs`
    go to the probes and the run, `trace` to the run (`FlowRun.launch`). The
    backend (`rlinf.workers.runtime.backend`) is started once if needed; a Ray started
    here is stopped when the returned run closes."""
    started = time.perf_counter()
    owns_ray = start_runtime(sorted({spec.worker.__module__ for spec in flow.components}))
    try:
        profile = profile_flow(flow, cluster, batch_sizes=batch_sizes,
                               device_counts=device_counts, timeout=timeout, inputs=inputs)
        seconds = time.perf_counter() - started
        ranked = plan_flow(flow, profile, cluster, options=options)
        best = ranked.best
        _log.info("flow_planned", flow=flow.name, plan=best.spec, mode=best.mode.value,
                  predicted_s=best.predicted_time, profile_s=seconds)
        run = FlowRun.launch(flow, best, cluster=cluster, timeout=timeout, stop_ray=owns_ray,
                             inputs=inputs, trace=trace)
    except BaseException:
        if owns_ray:
            from rlinf.workers.runtime.ray_session import stop_ray

            stop_ray()
        raise
    return run, AutoReport(plan=best, ranked=ranked, profile=profile, profile_seconds=seconds)
