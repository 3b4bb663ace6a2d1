"""The embodied workflow's planning hooks: fixed plans, and pricing and ranking plans from
a profile (the library's runner chooses when: `rlinf.workers.training.planning`).

A fixed placement keeps the env's pipeline stage groups as the env and rollout micro-batch
(``num_envs / pipeline_stages`` envs per message) and trains on the whole rollout. A
profile (the run's own first iterations, the cache, or a dry run's probes:
`EmbodiedFlow.measure` at a few batch sizes with the env ↔ policy link's round trips) is
fitted to cost curves (`rlinf.sched.fit_profile`), the cluster calibrated to what it
measured (`calibrated`), and plans are priced by the simulator (`price`) or ranked by the
M2Flow planner (`rank`).
"""

from __future__ import annotations

import math
from dataclasses import replace

import numpy as np
import structlog

from rlinf.sched import (
    Cluster,
    CostModel,
    ExecutionPlan,
    Placement,
    PlannerOptions,
    Profile,
    SimulationResult,
    Workflow,
    fit_profile,
    parse_placement,
    plan,
    simulate,
)
from rlinf.workers import flow as rf
from rlinf.workers.training import PlanChoice
from rlinf_embodied.config import PlacementConfig, resolve_placement

__all__ = [
    "calibrated",
    "calibrated_link",
    "cluster_for",
    "fitted_turns",
    "fixed_plan",
    "iteration_overhead",
    "link_cluster",
    "placement_on",
    "price",
    "profile_batch_sizes",
    "rank",
    "simulate_plan",
]

_log = structlog.get_logger(__name__)

CONTROL = rf.CONTROL
"""Profile entries of the driver's round trips to every role in an iteration."""
OVERHEADS = (rf.WEIGHT_SYNC, CONTROL)
"""Profile components that every iteration pays on top of the simulated dataflow."""

TIE_TOLERANCE = 0.02
"""Plans predicted within 2% of the fastest are tied and the one on fewest device slots is
chosen: profiles taken on a shared CPU box vary by more than that from run to run, and a
slot that buys nothing measurable adds a contending process (`PlannerOptions`)."""

def cluster_for(cfg: PlacementConfig) -> Cluster:
    """The devices placements are validated against: `num_devices` CPU slots of this
    machine (no Ray needed). Embodied components are processes on core slots; with
    ``run.device=cuda`` the policy processes share the machine's GPU through Ray
    (`ComponentSpec.num_gpus` in `workflow.declare`), so a GPU is not a placement device."""
    return Cluster.discover(use_ray=False, cpu_slots=cfg.num_devices, gpus=False)


def _on(placement: Placement, cluster: Cluster) -> Placement:
    """`placement` (a profiling flow's, on the devices it ran on) on `cluster`'s devices: the
    same components on the same device indices, the rest of the cluster unused."""
    if placement.num_devices == cluster.num_devices:
        return placement
    return parse_placement(placement.to_spec(), components=placement.component_names,
                           num_devices=cluster.num_devices)


def placement_on(cfg: PlacementConfig, workflow: Workflow, cluster: Cluster) -> Placement:
    """The configured placement on `cluster`'s devices (e.g. GPUs discovered: re-validated
    there)."""
    return _on(resolve_placement(cfg, components=workflow.names), cluster)


def _synchronous(workflow: Workflow) -> Workflow:
    """`workflow` without policy lag: how the profiling flows' drained iterations ran."""
    return replace(workflow, edges=tuple(replace(e, lagged=False) for e in workflow.edges))


def fixed_plan(placement: Placement, workflow: Workflow, *, pipeline_stages: int,
               label: str = "") -> ExecutionPlan:
    """The unpriced plan (predicted time NaN) of a placement the config fixes: env and
    rollout exchange one stage group per message, the actor trains on the whole rollout."""
    micro = {}
    for name in workflow.names:
        batch = workflow.batch_of(name)
        in_loop = workflow.loop_of(name) is not None
        micro[name] = max(1, batch // pipeline_stages) if in_loop else batch
    granularity = {e.key: micro[e.dst] for e in workflow.edges}
    return ExecutionPlan(placement, micro, granularity, math.nan, math.nan,
                         label or placement.mode.value)


def simulate_plan(chosen: ExecutionPlan, workflow: Workflow, cost: CostModel,
                  cluster: Cluster) -> SimulationResult:
    """One simulated iteration of `chosen`, with every busy interval (for a Gantt chart)."""
    return simulate(workflow, chosen.placement, cost, cluster,
                    micro_batch=chosen.micro_batch, record=True)


def profile_batch_sizes(num_envs: int, pipeline_stages: int) -> tuple[int, ...]:
    """Env counts to profile at: one env, a stage group and all envs. The planner may split
    the envs into groups down to one env each, so the cost curve's fixed part per call is
    measured at one env rather than extrapolated: fitted through 16 and 32 envs alone, a
    noisy point gave it a fixed part near zero, and `auto` chose 16 groups of 2 envs,
    priced at 0.069 s per iteration, that ran 0.277 s (2026-11-27)."""
    group = max(1, num_envs // pipeline_stages)
    return tuple(sorted({1, group, num_envs}))


def link_cluster(cluster: Cluster, workflow: Workflow, profile: Profile) -> Cluster:
    """`cluster` with the latency per message and the bandwidth of the env ↔ policy link
    fitted to the profile's ``link`` round trips (`EmbodiedFlow.measure` on a flow with a
    policy process), so the simulator charges a pipelined placement what its messages
    cost. A round trip of ``s`` envs is fitted as ``2 × latency + s × bytes / bandwidth``
    (the probe sends an observation message and gets it back); with one size measured, it
    is all latency. Unchanged without link measurements (collocated flows have none)."""
    points = [(m.batch_size, m.seconds) for m in profile.measurements if m.component == "link"]
    if not points:
        return cluster
    sizes = np.array([float(s) for s, _ in points])
    rtts = np.array([t for _, t in points])
    bandwidth = cluster.intra_node_bandwidth
    if len(set(sizes.tolist())) >= 2:
        slope, intercept = np.polyfit(sizes, rtts, 1)
        echoed = 2 * sum(e.bytes_per_item for e in workflow.edges if e.key == "env->rollout")
        if slope > 0:
            bandwidth = float(echoed / slope)
        latency = max(float(intercept), 0.0) / 2
    else:
        latency = float(np.median(rtts)) / 2
    _log.info("link_fitted", latency_s=latency, bandwidth=bandwidth, points=len(points))
    return replace(cluster, intra_node_latency=latency, intra_node_bandwidth=bandwidth)


def fitted_turns(cluster: Cluster, workflow: Workflow, profile: Profile,
                 cost: CostModel) -> Cluster:
    """`cluster` with the turn latency (`Cluster.turn_latency`: a device's hand-over from
    one process to another, the lock's release and grant and the new holder's wake-up)
    fitted to the iterations a profiling flow ran with its policy inline
    (``collocated_iteration``: their dataflow seconds, weight sync and the driver's round
    trips left out, as `EmbodiedFlow.probe` and the runtime's `run_profile` record them): no
    message crosses there, so what they cost beyond the simulated components is the
    hand-overs (the actor's
    after the rollout, the env's at the next iteration: ~4-6 ms each on 2 cores, which
    left every collocated plan 10-15% under-predicted, 2026-12-01). Never lowered;
    unchanged without such iterations."""
    synchronous = _synchronous(workflow)

    def simulated(probe: ExecutionPlan, _size: int, candidate: Cluster) -> float:
        return simulate(synchronous, _on(probe.placement, candidate), cost, candidate,
                        micro_batch=probe.micro_batch).iteration_time

    return rf.fit_turn_latency(cluster, profile, simulated)


def calibrated(cluster: Cluster, workflow: Workflow, profile: Profile,
               cost: CostModel) -> Cluster:
    """`cluster` as `profile` measured it: the link's round trips (`link_cluster`), the
    hand-overs (`fitted_turns`), then the link as the pipelined probe ran it
    (`calibrated_link`, which then prices only what the hand-overs leave)."""
    linked = link_cluster(cluster, workflow, profile)
    turned = fitted_turns(linked, workflow, profile, cost)
    return calibrated_link(turned, workflow, profile, cost)


def calibrated_link(cluster: Cluster, workflow: Workflow, profile: Profile,
                    cost: CostModel) -> Cluster:
    """`cluster` with the env ↔ policy link's latency per message raised until the simulated
    iteration of the plan the profiling flow ran matches the iterations it measured
    (``probe_iteration``: their dataflow seconds). A ping-pong of idle processes prices the
    link below what a pipelined iteration pays per message (the env and the policy contend
    for the cores with the driver and Ray: 20-25% under-predicted on 2 cores); the latency
    absorbs that, and only plans that send messages pay it. Never lowered; unchanged
    without a probe."""
    probe = rf.pipeline_probe(profile)
    if probe is None:
        return cluster
    # The probe's iterations ran synchronously (drained): price them so, lag or not.
    synchronous = _synchronous(workflow)

    def simulated(latency: float) -> float:
        linked = replace(cluster, intra_node_latency=latency)
        return simulate(synchronous, _on(probe.plan.placement, linked), cost, linked,
                        micro_batch=probe.plan.micro_batch).iteration_time

    latency = rf.fit_latency(cluster.intra_node_latency, probe.seconds, simulated)
    if latency == cluster.intra_node_latency:
        return cluster
    _log.info("link_calibrated", latency_s=latency, before_s=cluster.intra_node_latency,
              probe=probe.plan.spec, measured_s=probe.seconds)
    return replace(cluster, intra_node_latency=latency)


def iteration_overhead(profile: Profile) -> float:
    """Seconds every iteration pays outside the simulated dataflow, whatever the plan: the
    weight sync and the driver's control round trips (`EmbodiedFlow.measure` records them
    as `rf.WEIGHT_SYNC` and `CONTROL`); 0 for a profile without them."""
    return rf.overhead_seconds(profile, OVERHEADS)


def _with_simulation(plan_: ExecutionPlan, workflow: Workflow, cost: CostModel,
                     cluster: Cluster, *, overhead: float = 0.0
                     ) -> tuple[ExecutionPlan, SimulationResult]:
    """`plan_` priced by one recorded simulation, and that simulation (the predicted time
    and the switch count then come from the same run of the simulator)."""
    result = simulate_plan(plan_, workflow, cost, cluster)
    return replace(plan_, predicted_time=result.iteration_time + overhead,
                   utilisation=result.utilisation), result


def _costs(workflow: Workflow, costs: Profile | CostModel,
           cluster: Cluster) -> tuple[CostModel, Cluster, float]:
    """The cost model, the cluster as the profile measured it (`calibrated`) and the
    per-iteration overhead of `costs`: a measured profile, or a cost model as is (the
    re-planner's live one, no overhead)."""
    if not isinstance(costs, Profile):
        return costs, cluster, 0.0
    cost = fit_profile(costs)
    overhead = iteration_overhead(costs)
    return cost, calibrated(cluster, workflow, costs, cost), overhead


def price(plan_: ExecutionPlan, workflow: Workflow, costs: Profile | CostModel,
          cluster: Cluster) -> tuple[ExecutionPlan, SimulationResult]:
    """`plan_` with its simulated iteration time (plus the overhead every iteration pays),
    and that simulation."""
    cost, cluster, overhead = _costs(workflow, costs, cluster)
    return _with_simulation(plan_, workflow, cost, cluster, overhead=overhead)


def rank(workflow: Workflow, costs: Profile | CostModel, cluster: Cluster) -> PlanChoice:
    """The M2Flow planner's ranked plans of `workflow` on `cluster` priced from `costs`,
    the fastest chosen; plans within `TIE_TOLERANCE` go to the one on fewest slots."""
    cost, cluster, overhead = _costs(workflow, costs, cluster)
    result = plan(workflow, cost, cluster, options=PlannerOptions(tie_tolerance=TIE_TOLERANCE))
    chosen, simulation = _with_simulation(result.ranked[0], workflow, cost, cluster,
                                          overhead=overhead)
    _log.info("plan_chosen", spec=chosen.spec, mode=chosen.mode.value,
              predicted_s=round(chosen.predicted_time, 4))

    def paid(p: ExecutionPlan) -> ExecutionPlan:
        # Every plan pays the same overhead: shown on all, they compare as they ran.
        return replace(p, predicted_time=p.predicted_time + overhead)

    ranked = replace(result, ranked=(chosen, *map(paid, result.ranked[1:])),
                     baselines={name: paid(p) for name, p in result.baselines.items()})
    return PlanChoice(plan=chosen, ranked=ranked,
                      profile=costs if isinstance(costs, Profile) else None,
                      simulation=simulation)
