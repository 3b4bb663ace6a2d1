"""How the reasoning flow runs a plan, for the library's pricing
(`rlinf.workers.training.Pricing`), and the plans a run starts from.

The flow differs from the planner's picture in three ways: the rollout is one streaming call
of the whole batch, the stages after it take one message per call, and the actor trains the
whole batch at once, or its micro-batches as groups arrive where no rollout device is its
own (`streams_actor`: the streamed calls share one optimizer step, `StreamedCosts`). With
``actor.cut=auto`` the actor is priced under the cut each plan chooses (`CutPricedCosts`).
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
    Profile,
    StreamedCosts,
    TrainerCost,
    Workflow,
)
from rlinf.workers import flow as rf
from rlinf.workers.errors import ConfigError
from rlinf.workers.reasoning import ProblemSource as ProblemStream
from rlinf.workers.reasoning.problems import SeededProblems
from rlinf.workers.training import Pricing, ProfileCosts
from rlinf_reasoning.config import ReasoningConfig, component_names
from rlinf_reasoning.placement import resolve_placement
from rlinf_reasoning.spec import FlowSpec
from rlinf_reasoning.workflow import (
    TYPICAL_PROMPT_TOKENS,
    declare,
    fixed_plan,
    reasoning_workflow,
    streams_actor,
)

__all__ = ["ReasoningPricing", "first_guess", "planned_fixed", "profile_flow", "profile_spec",
           "trainer_cost"]

_log = structlog.get_logger(__name__)


class ReasoningPricing(Pricing):
    """Plans of `spec`'s flow priced as `ReasoningFlow` runs them (module docstring)."""

    def __init__(self, spec: FlowSpec) -> None:
        super().__init__(reasoning_workflow(spec))
        self.spec = spec
        self._workflows: dict[int, Workflow] = {1: self.workflow}

    def cost_model(self, profile: Profile, cluster: Cluster) -> CostModel:
        measured = ProfileCosts(profile)
        if not self.spec.choose_cut:
            return measured
        return CutPricedCosts(measured, trainer_cost(self.spec, measured, cluster))

    def at_batch(self, items: int) -> ReasoningPricing:
        prompts = max(1, items // self.spec.rollout.group_size)
        return ReasoningPricing(dataclasses.replace(self.spec, prompts_per_step=prompts))

    def workflow_for(self, plan_: ExecutionPlan) -> Workflow:
        ranks = plan_.placement.components["rollout"].num_procs
        if ranks not in self._workflows:  # a declaration per rank count, not per simulation
            self._workflows[ranks] = reasoning_workflow(self.spec, rollout_ranks=ranks)
        return self._workflows[ranks]

    def micro_batches(self, plan_: ExecutionPlan) -> dict[str, int]:
        micro = dict(plan_.micro_batch)
        group = self.spec.rollout.group_size
        batch = self.spec.prompts_per_step * group
        for edge, items in plan_.granularity.items():
            dst = edge.split("->", 1)[1]
            if dst not in ("actor", "rollout"):
                micro[dst] = min(int(items), batch)
        micro["rollout"] = batch
        micro["actor"] = batch
        if streams_actor(self.spec, plan_.placement):
            chunk = max(1, self.spec.actor.micro_batch_size // group) * group
            micro["actor"] = min(batch, chunk * plan_.placement.components["actor"].num_procs)
        return micro

    def simulated_costs(self, plan_: ExecutionPlan, cost: CostModel) -> CostModel:
        if not streams_actor(self.spec, plan_.placement):
            return cost
        return StreamedCosts(cost, component="actor",
                             whole=self.spec.prompts_per_step * self.spec.rollout.group_size)

    def finished(self, priced: ExecutionPlan, cost: CostModel,
                 micro: dict[str, int]) -> ExecutionPlan:
        if not isinstance(cost, CutPricedCosts):
            return priced
        # The cut priced at the batch the actor trains is the one the flow runs.
        devices = len(priced.placement.components["actor"].devices)
        cut = cost.trainer.cut(micro["actor"], devices).to_dict()
        return dataclasses.replace(priced, parallelism={**priced.parallelism, "actor": cut})

    def candidates(self, cluster: Cluster) -> Sequence[ExecutionPlan]:
        """The fixed modes with the config's message size, as a user would launch them: the
        planner's sizes are searched, the user's are what ``auto`` must not lose to."""
        plans = []
        for mode in ("collocated", "hybrid", "disaggregated"):
            try:
                placement = resolve_placement(mode, self.workflow.names, cluster.num_devices)
            except ConfigError:
                continue  # e.g. hybrid on one device
            plans.append(fixed_plan(self.spec, placement.to_spec(),
                                    num_devices=cluster.num_devices,
                                    granularity_groups=self.spec.rollout.groups_per_micro_batch))
        return tuple(plans)


def trainer_cost(spec: FlowSpec, measured: CostModel, cluster: Cluster) -> TrainerCost:
    """The actor as a `rlinf.sched.TrainerCost`: the policy's shape, the step's tokens, the
    cluster's links and smallest device memory, and a compute rate that reproduces the
    measured step of the whole batch on one device (so the model's compute and
    communication weigh as they do here)."""
    from rlinf.workers.actor.megatron import ModelShape

    model = spec.model.structure()
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
    process per device, taking turns in it — no process start, hand-over or message
    between processes that a profile would have to justify. On CPU slots, on no more
    slots than the nodes have cores (more would run a process per slot on shared cores)."""
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
                 source: SeededProblems) -> Profile:
    """`profile_spec` at each `run.profile_batches` size, with the pipelined probe unless
    the placement is collocated (nothing it calibrates touches that price)."""
    sizes = sorted({prompts * cfg.rollout.group_size for prompts in cfg.run.profile_batches})
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
    """Every component timed at `batch_sizes` on 1 and on all of `cluster`'s devices by
    throw-away probe runs (`rlinf.workers.flow.profile_flow`). A vLLM or SGLang rollout
    loads the model from a Hugging Face folder, exported for the probes (and removed after
    them) when the model is not in one already."""
    path, exported = spec.model.engine_folder(spec.engine)
    try:
        flow = declare(spec, problems=problems, granularity_groups=granularity_groups,
                       engine_model_path=path)
        return rf.profile_flow(flow, cluster, batch_sizes=batch_sizes, timeout=spec.timeout,
                               pipeline_probe=pipeline_probe)
    finally:
        if exported is not None:
            exported.cleanup()
