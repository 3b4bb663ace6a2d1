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

from rlinf.sched import (
    Cluster,
    CostModel,
    CutPricedCosts,
    ExecutionPlan,
    Profile,
    StreamedCosts,
    TrainerCost,
    Workflow,
)
from rlinf.workers import flow as rf
from rlinf.workers.errors import ConfigError
from rlinf.workers.reasoning import ProblemSource as ProblemStream
from rlinf.workers.training import Pricing
from rlinf_reasoning.placement import resolve_placement
from rlinf_reasoning.spec import FlowSpec
from rlinf_reasoning.workflow import (
    TYPICAL_PROMPT_TOKENS,
    declare,
    fixed_plan,
    reasoning_workflow,
    run_inputs,
    streams_actor,
)

__all__ = ["ReasoningPricing", "profile_spec", "trainer_cost"]

class ReasoningPricing(Pricing):
    """Plans of `spec`'s flow priced as `ReasoningFlow` runs them (module docstring)."""

    def __init__(self, spec: FlowSpec) -> None:
        super().__init__(reasoning_workflow(spec))
        self.spec = spec
        self._workflows: dict[int, Workflow] = {1: self.workflow}

    def cost_model(self, profile: Profile, cluster: Cluster) -> CostModel:
        measured = self.fitted(profile)
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
    """The actor as a `rlinf.sched.TrainerCost` (`rlinf.workers.actor.megatron.layout.
    trainer_cost`), at the tokens of a typical prompt and the longest response."""
    from rlinf.workers.actor.megatron.layout import trainer_cost as cost_of

    return cost_of(spec.model.structure(), measured, cluster,
                   batch=spec.prompts_per_step * spec.rollout.group_size,
                   tokens_per_item=TYPICAL_PROMPT_TOKENS + spec.rollout.sampling.max_new_tokens,
                   micro_batch=spec.actor.micro_batch_size, bf16=spec.actor.precision == "bf16")


def profile_spec(spec: FlowSpec, cluster: Cluster, *, batch_sizes: Sequence[int],
                 problems: ProblemStream, granularity_groups: int,
                 pipeline_probe: bool = True) -> Profile:
    """Every component timed at `batch_sizes` on 1 and on all of `cluster`'s devices by
    throw-away probe runs (`rlinf.workers.flow.profile_flow`; a vLLM or SGLang rollout
    loads a Hugging Face folder, exported for the probes when the model is in none)."""
    with spec.model.served(spec.engine) as path:
        flow = declare(spec, granularity_groups=granularity_groups)
        return rf.profile_flow(flow, cluster, batch_sizes=batch_sizes, timeout=spec.timeout,
                               inputs=run_inputs(problems, engine_model_path=path),
                               pipeline_probe=pipeline_probe)
