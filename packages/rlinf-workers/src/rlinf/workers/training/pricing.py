"""How a workflow's plans are priced and ranked as its flow runs them: `Pricing`.

A plan is priced by one discrete-event simulation of an iteration (`rlinf.sched.simulate`)
with costs fitted to a measured profile, on the cluster calibrated to what the profile's
probes measured, plus the seconds every iteration pays beside the dataflow (the weight
sync and whatever else `Pricing.overheads` names). `Pricing.rank` asks the M2Flow planner
(`rlinf.sched.plan`) for ranked plans, prices each again as the flow will run it (the flow
may run other micro-batches than the planner chose) and chooses the fastest.

An app subclasses `Pricing` where its flow runs a plan differently from the planner's
picture: other micro-batches per call (`micro_batches`), another workflow per plan
(`workflow_for`), a cost model that wraps the fitted one (`cost_model`, `simulated_costs`),
or a calibration of its own (`calibrated`: the link and turn fits below compose one).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence

import numpy as np
import structlog

from rlinf.sched import (
    Cluster,
    CostModel,
    ExecutionPlan,
    Placement,
    PlannerOptions,
    PlanningError,
    Profile,
    ProgressCallback,
    SimulationResult,
    Workflow,
    fit_profile,
    parse_placement,
    plan,
    simulate,
)
from rlinf.workers.flow import auto as rf
from rlinf.workers.flow.records import EDGE_BYTES
from rlinf.workers.training.task import PlanChoice

__all__ = ["Pricing", "ProfileCosts", "calibrated_link", "fitted_turns", "link_cluster",
           "measured_edges", "on_cluster", "synchronous"]

_log = structlog.get_logger(__name__)


class ProfileCosts:
    """`rlinf.sched.CostModel` of a measured profile; memory the profile did not measure
    (``memory_source="none"``, e.g. CPU slots sharing host memory) is priced at 0 bytes, so
    it constrains no placement, instead of failing the simulation."""

    def __init__(self, profile: Profile) -> None:
        self.fitted = fit_profile(profile)

    def time(self, component: str, *, batch_size: int, num_devices: int) -> float:
        """Fitted seconds of one call."""
        return self.fitted.time(component, batch_size=batch_size, num_devices=num_devices)

    def memory(self, component: str, *, batch_size: int, num_devices: int) -> int:
        """Fitted peak bytes per device, or 0 when the profile did not measure memory."""
        if component not in self.fitted.memory_curves:
            return 0
        return self.fitted.memory(component, batch_size=batch_size, num_devices=num_devices)

    def switch_time(self, component: str) -> float:
        """Measured offload + onload seconds (0 if never switched)."""
        return self.fitted.switch_time(component)


class Pricing:
    """Prices and ranks the plans of `workflow` from a profile or a cost model.

    The defaults price a plan as the planner pictures it: its own micro-batches, the
    declared workflow, costs fitted to the profile, the cluster calibrated by the probes'
    iterations (`rlinf.workers.flow.auto.calibrated_cluster`), each edge's bytes per item as
    the profile's channels measured them. Subclasses override the hooks."""

    overheads: tuple[str, ...] = (rf.WEIGHT_SYNC,)
    """Profile components every iteration pays beside the simulated dataflow."""
    tie_tolerance: float = 0.0
    """Plans priced within this fraction of the fastest are tied; the planner's order among
    them (fewest device slots first, `PlannerOptions.tie_tolerance`) decides."""

    def __init__(self, workflow: Workflow) -> None:
        self.workflow = workflow
        self._fit: tuple[Profile, ProfileCosts] | None = None
        self.edge_bytes: Mapping[str, float] = {}
        """Bytes per item each edge carried in the last priced profile (`measured_edges`),
        priced in place of the declaration's estimates (`priced_workflow`)."""

    def fitted(self, profile: Profile) -> ProfileCosts:
        """`profile`'s fitted costs, fitted once per profile: calibration and pricing share
        them (a fit runs a least-squares fit per component, device count and curve)."""
        if self._fit is None or self._fit[0] is not profile:
            self._fit = (profile, ProfileCosts(profile))
        return self._fit[1]

    # -- hooks --------------------------------------------------------------------------------
    def cost_model(self, profile: Profile, cluster: Cluster) -> CostModel:
        """The cost model of a measured profile."""
        return self.fitted(profile)

    def at_batch(self, items: int) -> Pricing:
        """This pricing for iterations of `items` items (a probe ran other batch sizes)."""
        return _AtBatch(dataclasses.replace(self.workflow, global_batch=items))

    def calibrated(self, cluster: Cluster, profile: Profile) -> Cluster:
        """`cluster` fitted to the probes' iterations in `profile`, each probe simulated as
        the flow runs it at the batch it ran (`rlinf.workers.flow.auto.calibrated_cluster`)."""
        cost = self.fitted(profile)
        scaled: dict[int, Pricing] = {}  # one per probe size: the fits bisect many times

        def simulated(probe: ExecutionPlan, size: int, candidate: Cluster) -> float:
            if size not in scaled:
                scaled[size] = self.at_batch(size)
                scaled[size].edge_bytes = self.edge_bytes
            return scaled[size].simulation(probe, cost, candidate).iteration_time

        return rf.calibrated_cluster(cluster, profile, simulated)

    def workflow_for(self, plan_: ExecutionPlan) -> Workflow:
        """The workflow as `plan_` runs it."""
        return self.workflow

    def micro_batches(self, plan_: ExecutionPlan) -> dict[str, int]:
        """Items per call of each component as the flow runs `plan_`."""
        return dict(plan_.micro_batch)

    def simulated_costs(self, plan_: ExecutionPlan, cost: CostModel) -> CostModel:
        """The cost model the simulation of `plan_` charges (e.g. calls that share a fixed
        part)."""
        return cost

    def finished(self, priced: ExecutionPlan, cost: CostModel,
                 micro: dict[str, int]) -> ExecutionPlan:
        """`priced` with whatever else its pricing chose (e.g. a trainer's cut)."""
        return priced

    def candidates(self, cluster: Cluster) -> Sequence[ExecutionPlan]:
        """Plans that compete with the planner's (e.g. the fixed modes as a user would
        launch them)."""
        return ()

    def priced_workflow(self, workflow: Workflow) -> Workflow:
        """`workflow` with each edge's bytes per item as measured (`edge_bytes`), where
        measured: what the runtime measures, the declaration need not estimate."""
        if not self.edge_bytes:
            return workflow
        return dataclasses.replace(workflow, edges=tuple(
            dataclasses.replace(e, bytes_per_item=self.edge_bytes[e.key])
            if e.key in self.edge_bytes else e for e in workflow.edges))

    # -- pricing ------------------------------------------------------------------------------
    def simulation(self, plan_: ExecutionPlan, cost: CostModel,
                   cluster: Cluster) -> SimulationResult:
        """One recorded simulated iteration of `plan_` as the flow runs it."""
        return simulate(self.priced_workflow(self.workflow_for(plan_)), plan_.placement,
                        self.simulated_costs(plan_, cost), cluster,
                        micro_batch=self.micro_batches(plan_), record=True)

    def costs(self, costs: Profile | CostModel,
              cluster: Cluster) -> tuple[CostModel, Cluster, float]:
        """The cost model, the cluster as the profile measured it and the overhead per
        iteration of `costs`: a measured profile, or a cost model as is (the live one of
        the re-planner: no overhead)."""
        if not isinstance(costs, Profile):
            return costs, cluster, 0.0
        self.edge_bytes = measured_edges(costs) or self.edge_bytes
        calibrated = self.calibrated(cluster, costs)
        return (self.cost_model(costs, calibrated), calibrated,
                rf.overhead_seconds(costs, self.overheads))

    def price(self, plan_: ExecutionPlan, costs: Profile | CostModel,
              cluster: Cluster) -> tuple[ExecutionPlan, SimulationResult]:
        """`plan_` with its predicted iteration time, and the simulation that priced it."""
        cost, cluster, overhead = self.costs(costs, cluster)
        return self._priced(plan_, cost, cluster, overhead)

    def _priced(self, plan_: ExecutionPlan, cost: CostModel, cluster: Cluster,
                overhead: float) -> tuple[ExecutionPlan, SimulationResult]:
        result = self.simulation(plan_, cost, cluster)
        priced = dataclasses.replace(plan_, predicted_time=result.iteration_time + overhead,
                                     utilisation=result.utilisation)
        return self.finished(priced, cost, self.micro_batches(plan_)), result

    def rank(self, costs: Profile | CostModel, cluster: Cluster, *,
             options: PlannerOptions | None = None,
             progress: ProgressCallback | None = None) -> PlanChoice:
        """The planner's ranked plans, its baselines and `candidates`, each priced as the
        flow runs it (`price`; a plan that does not fit the devices' memory so is dropped);
        the fastest is chosen, ties (`tie_tolerance`) going to the planner's order.
        `options` go to the planner (default: `planner_options`), and so does `progress`
        (called every few seconds of a long search)."""
        cost, calibrated, overhead = self.costs(costs, cluster)
        result = plan(self.priced_workflow(self.workflow), cost, calibrated,
                      options=options or self.planner_options(), progress=progress)
        ordered: dict[tuple[object, ...], ExecutionPlan] = {}
        for candidate in (*result.ranked, *result.baselines.values(),
                          *self.candidates(cluster)):
            ordered[self._key(candidate)] = candidate  # a later one replaces its twin
        priced: dict[tuple[object, ...], tuple[ExecutionPlan, SimulationResult]] = {}
        for key, candidate in ordered.items():
            try:
                priced[key] = self._priced(candidate, cost, calibrated, overhead)
            except PlanningError as exc:
                _log.info("plan_does_not_fit_as_run", plan=candidate.spec, reason=str(exc))
        if not priced:
            raise PlanningError(f"none of the planner's {len(ordered)} plans fits the "
                                "devices' memory at the micro-batches the flow runs: give "
                                "the run more devices or smaller batches")
        fastest = min(p.predicted_time for p, _ in priced.values())
        tied = [pair for pair in priced.values()
                if pair[0].predicted_time <= fastest * (1 + self.tie_tolerance)]
        best, simulation = tied[0]
        by_price = sorted(priced.values(), key=lambda pair: pair[0].predicted_time)
        ranked = dataclasses.replace(
            result, ranked=(best, *(p for p, _ in by_price if p is not best)),
            baselines={name: priced[self._key(p)][0] for name, p in result.baselines.items()
                       if self._key(p) in priced})
        _log.info("plan_chosen", spec=best.spec, mode=best.mode.value,
                  predicted_s=round(best.predicted_time, 4))
        return PlanChoice(plan=best, ranked=ranked,
                          profile=costs if isinstance(costs, Profile) else None,
                          simulation=simulation)

    def planner_options(self, *, exact_seconds: float | None = None,
                        search_seconds: float | None = None) -> PlannerOptions:
        """The planner's options for this pricing: its `tie_tolerance`, `exact_seconds` for
        the exact pass and `search_seconds` for the whole search (`PlannerOptions`)."""
        return PlannerOptions(tie_tolerance=self.tie_tolerance, exact_seconds=exact_seconds,
                              search_seconds=search_seconds)

    def _key(self, plan_: ExecutionPlan) -> tuple[object, ...]:
        """What tells two plans apart as the flow runs them."""
        return (plan_.spec, tuple(sorted(plan_.granularity.items())),
                tuple(sorted(self.micro_batches(plan_).items())))


class _AtBatch(Pricing):
    """The default `Pricing.at_batch`: the planner's micro-batches, none over the batch."""

    def micro_batches(self, plan_: ExecutionPlan) -> dict[str, int]:
        items = self.workflow.global_batch
        return {name: min(size, items) for name, size in plan_.micro_batch.items()}


# -- calibrations a pricing composes ---------------------------------------------------------
def measured_edges(profile: Profile) -> dict[str, float]:
    """``{edge: bytes per item}`` the profile's runs measured on their channels
    (`rlinf.workers.flow.records.edge_bytes_per_item`); empty where none was measured."""
    measured = profile.metadata.get(EDGE_BYTES) or {}
    return {str(edge): float(nbytes) for edge, nbytes in dict(measured).items()}


def on_cluster(placement: Placement, cluster: Cluster) -> Placement:
    """`placement` (a probe's, on the devices it ran on) on `cluster`'s devices: the same
    components on the same device indices, the rest of the cluster unused."""
    if placement.num_devices == cluster.num_devices:
        return placement
    return parse_placement(placement.to_spec(), components=placement.component_names,
                           num_devices=cluster.num_devices)


def synchronous(workflow: Workflow) -> Workflow:
    """`workflow` without policy lag: how probes' drained iterations ran."""
    return dataclasses.replace(
        workflow, edges=tuple(dataclasses.replace(e, lagged=False) for e in workflow.edges))


def link_cluster(cluster: Cluster, workflow: Workflow, profile: Profile, *,
                 component: str, edge: str) -> Cluster:
    """`cluster` with the latency per message and the bandwidth of a link fitted to the
    profile's `component` entries: round trips of `edge`'s message of ``s`` items, sent and
    echoed, fitted as ``2 × latency + s × bytes / bandwidth``; with one size measured, all
    latency. Unchanged without such entries."""
    points = [(m.batch_size, m.seconds) for m in profile.measurements if m.component == component]
    if not points:
        return cluster
    sizes = np.array([float(s) for s, _ in points])
    rtts = np.array([t for _, t in points])
    bandwidth = cluster.intra_node_bandwidth
    if len(set(sizes.tolist())) >= 2:
        slope, intercept = np.polyfit(sizes, rtts, 1)
        echoed = 2 * sum(e.bytes_per_item for e in workflow.edges if e.key == edge)
        if slope > 0:
            bandwidth = float(echoed / slope)
        latency = max(float(intercept), 0.0) / 2
    else:
        latency = float(np.median(rtts)) / 2
    _log.info("link_fitted", latency_s=latency, bandwidth=bandwidth, points=len(points))
    return dataclasses.replace(cluster, intra_node_latency=latency,
                               intra_node_bandwidth=bandwidth)


def fitted_turns(cluster: Cluster, workflow: Workflow, profile: Profile,
                 cost: CostModel) -> Cluster:
    """`cluster` with the turn latency (a device's hand-over from one process to another)
    fitted to the collocated probes' iterations in `profile`, simulated synchronously on
    the devices they ran on (`rlinf.workers.flow.auto.fit_turn_latency`)."""
    drained = synchronous(workflow)

    def simulated(probe: ExecutionPlan, _size: int, candidate: Cluster) -> float:
        return simulate(drained, on_cluster(probe.placement, candidate), cost, candidate,
                        micro_batch=probe.micro_batch).iteration_time

    return rf.fit_turn_latency(cluster, profile, simulated)


def calibrated_link(cluster: Cluster, workflow: Workflow, profile: Profile,
                    cost: CostModel) -> Cluster:
    """`cluster` with its intra-node latency per message raised until the simulated
    iteration of the pipelined probe in `profile` matches the iterations it measured: an
    idle ping-pong prices a link below what a pipelined iteration pays per message (the
    processes contend for cores), and only plans that send messages pay the difference.
    Never lowered; unchanged without a probe."""
    probe = rf.pipeline_probe(profile)
    if probe is None:
        return cluster
    drained = synchronous(workflow)

    def simulated(latency: float) -> float:
        linked = dataclasses.replace(cluster, intra_node_latency=latency)
        return simulate(drained, on_cluster(probe.plan.placement, linked), cost, linked,
                        micro_batch=probe.plan.micro_batch).iteration_time

    latency = rf.fit_latency(cluster.intra_node_latency, probe.seconds, simulated)
    if latency == cluster.intra_node_latency:
        return cluster
    _log.info("link_calibrated", latency_s=latency, before_s=cluster.intra_node_latency,
              probe=probe.plan.spec, measured_s=probe.seconds)
    return dataclasses.replace(cluster, intra_node_latency=latency)
