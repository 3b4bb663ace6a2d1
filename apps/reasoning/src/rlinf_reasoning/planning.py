"""The execution plan of a run: a fixed placement, or ``auto`` (profile → fit → plan).

- Fixed placements (``collocated``, ``hybrid``, ``disaggregated``, explicit specs) become an
  `ExecutionPlan` with `rlinf_reasoning.workflow.fixed_plan`; edges carry one rollout
  micro-batch of groups per message.
- Profiling (`profile_flow`, for ``auto`` and for pricing a fixed plan) is the flow
  runtime's: `rlinf.workers.flow.profile_flow` launches throw-away probe runs of the
  declared workflow collocated on 1 and on all devices, times every component at each
  `run.profile_batches` size (busy time, peak memory, onloads and offloads, weight syncs),
  and closes them before the run starts, so the run's trajectory is the one a fixed
  placement gives. For ``auto`` and pipelined placements on CPU slots, a pipelined probe
  (rollout on slot 0, the rest on slot 1) measures what collocated probes cannot:
  `calibrated` fits the latency of a message between processes to it.
- ``auto`` fits cost curves (`rlinf.sched.fit_profile`) and asks the M2Flow planner
  (`rlinf.sched.plan`) for ranked plans of `reasoning_workflow(spec)` on this cluster; the
  fastest is launched.
- Any plan can be priced from a profile (`predict`): the discrete-event simulation of one
  iteration plus the measured weight sync gives the predicted time, set on the plan, and
  the Gantt the trace shows next to the measured timeline.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence

import structlog

from rlinf.sched import (
    Cluster,
    CostModel,
    CutPricedCosts,
    ExecutionMode,
    ExecutionPlan,
    PlanningError,
    Profile,
    SimulationResult,
    StreamedCosts,
    TrainerCost,
    Workflow,
    plan,
    simulate,
)
from rlinf.workers import flow as rf
from rlinf.workers.errors import ConfigError
from rlinf.workers.reasoning import ProblemSource as ProblemStream
from rlinf.workers.training import PlanChoice, ProfileCosts
from rlinf_reasoning.config import ReasoningConfig, component_names
from rlinf_reasoning.data import ProblemSource
from rlinf_reasoning.models import export_for_engine, policy_structure
from rlinf_reasoning.placement import resolve_placement
from rlinf_reasoning.spec import FlowSpec
from rlinf_reasoning.workflow import (
    TYPICAL_PROMPT_TOKENS,
    declare,
    fixed_plan,
    reasoning_workflow,
    streams_actor,
)

__all__ = [
    "auto_plan",
    "calibrated",
    "cost_model",
    "execution_workflow",
    "first_guess",
    "planned_fixed",
    "predict",
    "profile_flow",
    "profile_spec",
    "trainer_cost",
    "weight_sync_seconds",
]

_log = structlog.get_logger(__name__)


def cost_model(spec: FlowSpec, profile: Profile, cluster: Cluster) -> CostModel:
    """The cost model of a measured `profile`: `ProfileCosts`, with the actor priced under
    the cut each plan chooses where the planner chooses it (``actor.cut=auto``:
    `rlinf.sched.CutPricedCosts` over `trainer_cost`)."""
    measured = ProfileCosts(profile)
    if not spec.choose_cut:
        return measured
    return CutPricedCosts(measured, trainer_cost(spec, measured, cluster))


def trainer_cost(spec: FlowSpec, measured: CostModel, cluster: Cluster) -> TrainerCost:
    """The actor as a `rlinf.sched.TrainerCost`: the policy's shape, the step's tokens, the
    cluster's links and smallest device memory, and a compute rate that reproduces the
    measured step of the whole batch on one device (so the model's compute and
    communication weigh as they do here)."""
    from rlinf.workers.actor.megatron import ModelShape

    model = policy_structure(spec)
    shape = ModelShape.from_hf(getattr(model, "config", None))
    parameters = float(sum(p.numel() for p in model.parameters()))
    batch = spec.prompts_per_step * spec.rollout.group_size
    tokens = TYPICAL_PROMPT_TOKENS + spec.rollout.sampling.max_new_tokens
    one_device = measured.time("actor", batch_size=batch, num_devices=1)
    flops = 6 * parameters * tokens * batch / max(one_device, 1e-9)
    return TrainerCost(
        parameters=parameters, layers=shape.num_layers, hidden=shape.hidden_size,
        heads=shape.num_heads, kv_heads=shape.num_kv_heads, vocab=shape.vocab_size,
        tokens_per_item=tokens, micro_batch=spec.actor.micro_batch_size, device_flops=flops,
        efficiency=1.0, bandwidth=cluster.intra_node_bandwidth,
        latency=max(cluster.intra_node_latency, cluster.message_latency, 1e-9),
        device_memory=float(min(d.memory_bytes for d in cluster.devices)),
        activation_bytes=2.0 if spec.actor.precision == "bf16" else 4.0)


def planned_fixed(cfg: ReasoningConfig, spec: FlowSpec, num_devices: int) -> ExecutionPlan:
    """The plan of a fixed placement (not ``auto``), unpriced (predicted_time 0)."""
    placement = resolve_placement(cfg.placement, component_names(cfg), num_devices)
    return fixed_plan(spec, placement.to_spec(), num_devices=num_devices,
                      granularity_groups=cfg.rollout.groups_per_micro_batch)


def first_guess(cfg: ReasoningConfig, spec: FlowSpec, cluster: Cluster) -> ExecutionPlan:
    """``auto``'s plan when no profile prices any: every component on every device, one
    process per device (`rlinf.sched.process_sets`), taking turns in it — no process start,
    hand-over or message between processes that a profile would have to justify. On CPU
    slots, on no more slots than the nodes have cores: more slots than cores (a user's
    ``cluster.cpu_slots``) would run a process per slot on shared cores."""
    devices = cluster.num_devices
    cores = sum(node.cpus for node in cluster.nodes)
    if not cluster.has_gpus and cores > 0:
        devices = max(1, min(devices, cores))
    placement = resolve_placement("collocated", component_names(cfg), devices)
    plan_ = fixed_plan(spec, placement.to_spec(), num_devices=cluster.num_devices,
                       granularity_groups=cfg.rollout.groups_per_micro_batch)
    if not spec.choose_cut:
        return plan_
    # actor.cut=auto with nothing measured: the data-parallel cut (every device a replica),
    # the one a profile is measured with, until a profile prices the others.
    devices = len(plan_.placement.devices_of("actor"))
    cut = {"tensor": 1, "pipeline": 1, "data": devices, "sequence_parallel": 0,
           "distributed_optimizer": 0}
    return dataclasses.replace(plan_, parallelism={**plan_.parallelism, "actor": cut})


def profile_flow(spec: FlowSpec, cfg: ReasoningConfig, cluster: Cluster,
                 source: ProblemSource) -> Profile:
    """Every component of the flow timed at each `run.profile_batches` size on 1 and on all
    of `cluster`'s devices, by probe runs closed before the run starts (module docstring)."""
    group = cfg.rollout.group_size
    sizes = sorted({prompts * group for prompts in cfg.run.profile_batches})
    # A collocated plan computes one component at a time on one device set: what the
    # pipelined probe calibrates (cores shared side by side, messages between device sets)
    # never touches its price.
    collocated = cfg.placement.strip().lower() != "auto" and \
        planned_fixed(cfg, spec, cluster.num_devices).mode is ExecutionMode.COLLOCATED
    profile = profile_spec(spec, cluster, batch_sizes=sizes, problems=source,
                           granularity_groups=cfg.rollout.groups_per_micro_batch,
                           pipeline_probe=not collocated)
    _log.info("profiled", sizes=sizes, measurements=len(profile.measurements))
    return profile


def profile_spec(spec: FlowSpec, cluster: Cluster, *, batch_sizes: Sequence[int],
                 problems: ProblemStream, granularity_groups: int,
                 pipeline_probe: bool = True) -> Profile:
    """`rlinf.workers.flow.profile_flow` of `spec`'s workflow; a vLLM or SGLang rollout
    loads the model from a Hugging Face folder, exported for the probes (and removed after
    them) when the model is not in one already, as `ReasoningFlow.launch` does."""
    path, exported = export_for_engine(spec)
    try:
        flow = declare(spec, problems=problems, granularity_groups=granularity_groups,
                       engine_model_path=path)
        return rf.profile_flow(flow, cluster, batch_sizes=batch_sizes, timeout=spec.timeout,
                               pipeline_probe=pipeline_probe)
    finally:
        if exported is not None:
            exported.cleanup()


def _simulated_micro_batches(plan: ExecutionPlan, spec: FlowSpec) -> dict[str, int]:
    """Items per call as the flow runs them: the rollout is one streaming call, the stages
    after it take one message (the edge's granularity) per call, and the actor trains its
    micro-batches as they arrive where it streams (`streams_actor`: ``micro_batch_size``
    rows of whole groups per rank), else the whole batch at once."""
    micro = dict(plan.micro_batch)
    group = spec.rollout.group_size
    batch = spec.prompts_per_step * group
    for edge, items in plan.granularity.items():
        dst = edge.split("->", 1)[1]
        if dst not in ("actor", "rollout"):
            micro[dst] = min(int(items), batch)
    micro["rollout"] = batch
    micro["actor"] = batch
    if streams_actor(spec, plan.placement):
        chunk = max(1, spec.actor.micro_batch_size // group) * group
        micro["actor"] = min(batch, chunk * plan.placement.components["actor"].num_procs)
    return micro


def execution_workflow(plan: ExecutionPlan, spec: FlowSpec) -> Workflow:
    """`reasoning_workflow` for the rollout ranks `plan` launches."""
    return reasoning_workflow(spec, rollout_ranks=plan.placement.components["rollout"].num_procs)


def predict(plan_: ExecutionPlan, spec: FlowSpec, profile: Profile | CostModel,
            cluster: Cluster) -> tuple[ExecutionPlan, SimulationResult]:
    """`plan_` with the predicted iteration time and utilisation of its simulation, run the
    way the flow executes it (`_simulated_micro_batches`), priced from a measured profile
    (on the cluster `calibrated` to it, plus the weight sync it measured) or any cost model
    (the re-planner's live one)."""
    if isinstance(profile, Profile):
        cluster = calibrated(cluster, profile, spec)
        return _priced(plan_, spec, cost_model(spec, profile, cluster), cluster,
                       overhead=weight_sync_seconds(profile))
    return _priced(plan_, spec, profile, cluster)


def _priced(plan_: ExecutionPlan, spec: FlowSpec, cost: CostModel, cluster: Cluster, *,
            overhead: float = 0.0) -> tuple[ExecutionPlan, SimulationResult]:
    micro = _simulated_micro_batches(plan_, spec)
    simulated_cost: CostModel = cost
    if streams_actor(spec, plan_.placement):
        # The streamed micro-batches share one optimizer step: each costs its share of the
        # whole batch's call, not a whole call's fixed part (`StreamedCosts`).
        simulated_cost = StreamedCosts(cost, component="actor",
                                       whole=spec.prompts_per_step * spec.rollout.group_size)
    simulation = simulate(execution_workflow(plan_, spec), plan_.placement, simulated_cost,
                          cluster, micro_batch=micro, record=True)
    priced = dataclasses.replace(plan_, predicted_time=simulation.iteration_time + overhead,
                                 utilisation=simulation.utilisation)
    if isinstance(cost, CutPricedCosts):
        # The cut priced here, at the batch the actor trains, is the one the flow runs.
        devices = len(plan_.placement.components["actor"].devices)
        cut = cost.trainer.cut(micro["actor"], devices).to_dict()
        priced = dataclasses.replace(priced, parallelism={**plan_.parallelism, "actor": cut})
    return priced, simulation


def _plan_key(plan_: ExecutionPlan) -> tuple[str, tuple[tuple[str, int], ...]]:
    """What tells two plans apart as the flow runs them: placement and message sizes (the
    planner's micro-batches are replaced by the flow's, `_simulated_micro_batches`)."""
    return plan_.spec, tuple(sorted(plan_.granularity.items()))


def _priced_if_it_fits(plan_: ExecutionPlan, spec: FlowSpec, cost: CostModel,
                       cluster: Cluster, overhead: float
                       ) -> tuple[ExecutionPlan, SimulationResult] | None:
    """`_priced`, or None when the plan does not fit the devices' memory as the flow runs it
    (the planner may have priced it at smaller micro-batches than the flow's)."""
    try:
        return _priced(plan_, spec, cost, cluster, overhead=overhead)
    except PlanningError as exc:
        _log.info("plan_does_not_fit_as_run", plan=plan_.spec, reason=str(exc))
        return None


def _fixed_mode_plans(spec: FlowSpec, components: Sequence[str],
                      num_devices: int) -> tuple[ExecutionPlan, ...]:
    """The collocated, hybrid and disaggregated plans with the config's message size, as
    a fixed placement would launch them (those the devices allow)."""
    plans = []
    for mode in ("collocated", "hybrid", "disaggregated"):
        try:
            placement = resolve_placement(mode, components, num_devices)
        except ConfigError:
            continue  # e.g. hybrid on one device
        plans.append(fixed_plan(spec, placement.to_spec(), num_devices=num_devices,
                                granularity_groups=spec.rollout.groups_per_micro_batch))
    return tuple(plans)


def weight_sync_seconds(profile: Profile) -> float:
    """Median seconds of the weight syncs the profiling probes ran (0 without any): every
    plan pays one per iteration besides the dataflow the simulator models."""
    return rf.overhead_seconds(profile, (rf.WEIGHT_SYNC,))


def calibrated(cluster: Cluster, profile: Profile, spec: FlowSpec) -> Cluster:
    """`cluster` with its message latency fitted to the pipelined probe in `profile`
    (`rlinf.workers.flow.calibrated_cluster`), the probe simulated as the flow runs it
    (`predict`) at the batch it ran; unchanged without one."""
    cost = ProfileCosts(profile)

    def simulated(probe: ExecutionPlan, size: int, candidate: Cluster) -> float:
        prompts = max(1, size // spec.rollout.group_size)
        at_size = dataclasses.replace(spec, prompts_per_step=prompts)
        return _priced(probe, at_size, cost, candidate)[1].iteration_time

    return rf.calibrated_cluster(cluster, profile, simulated)


def auto_plan(spec: FlowSpec, profile: Profile | CostModel, cluster: Cluster) -> PlanChoice:
    """The planner's ranked plans for `spec` on `cluster` from `profile` (or a cost model),
    each (and each fixed-mode baseline) priced again as the flow will run it (`predict`: the
    flow keeps the config's rollout and actor micro-batches, which the planner may have
    chosen otherwise); the fastest by that price is chosen."""
    overhead = 0.0
    if isinstance(profile, Profile):
        cluster = calibrated(cluster, profile, spec)
        cost: CostModel = cost_model(spec, profile, cluster)
        overhead = weight_sync_seconds(profile)
    else:
        cost = profile
    workflow = reasoning_workflow(spec)
    result = plan(workflow, cost, cluster)
    # What a fixed placement would run (the config's message size) competes too: the
    # planner's sizes are searched, the user's are what `auto` must not lose to.
    fixed = _fixed_mode_plans(spec, tuple(c.name for c in workflow.components),
                              cluster.num_devices)
    candidates = {_plan_key(p): p for p in (*result.ranked, *result.baselines.values(),
                                            *fixed)}
    runnable = {key: pair for key, p in candidates.items()
                if (pair := _priced_if_it_fits(p, spec, cost, cluster, overhead)) is not None}
    if not runnable:
        raise PlanningError(f"none of the planner's {len(candidates)} plans fits the devices' "
                            "memory at the micro-batches the flow runs (the whole batch per "
                            "actor call unless it streams): give the run more devices or "
                            "fewer prompts per step")
    priced = sorted(runnable.values(), key=lambda pair: pair[0].predicted_time)
    best, simulation = priced[0]
    ranked = dataclasses.replace(
        result, ranked=tuple(p for p, _ in priced),
        baselines={name: runnable[_plan_key(p)][0] for name, p in result.baselines.items()
                   if _plan_key(p) in runnable})
    return PlanChoice(plan=best, ranked=ranked,
                      profile=profile if isinstance(profile, Profile) else None,
                      simulation=simulation)
