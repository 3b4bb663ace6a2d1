"""`auto` planning proposes only plans the reasoning flow runs exactly, and prices them from
what the profiling probes measured (no Ray needed).

The flow hands every role messages of whole GRPO groups and shards an iteration's groups
over each consumer's ranks (`rlinf.workers.flow.FlowChannel`), refusing a rank without a
group (`FlowChannel.check_shards`). The planner must propose only micro-batches of
whole groups, at least one group per device, whatever the prompt count, group size and
devices.
"""

from __future__ import annotations

import dataclasses

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from rlinf_reasoning.pricing import ReasoningPricing, trainer_cost
from rlinf_reasoning.spec import FlowSpec
from rlinf_reasoning.workflow import declare, fixed_plan, reasoning_workflow

from rlinf.sched import (
    AnalyticCost,
    AnalyticCostModel,
    Cluster,
    ExecutionPlan,
    Measurement,
    ParallelCut,
    Profile,
    plan,
)
from rlinf.sched.granularity import check_micro_batches
from rlinf.workers.actor.megatron import MegatronConfig
from rlinf.workers.flow import FlowChannel
from rlinf.workers.flow.auto import PROBE_ITERATION, WEIGHT_SYNC
from rlinf.workers.models import TinyLMConfig
from rlinf.workers.models.sources import ModelSource
from rlinf.workers.rollout import RolloutGeneratorConfig
from rlinf.workers.training import ProfileCosts

GIB = 2**30


def assert_runs_as_planned(spec: FlowSpec, chosen: ExecutionPlan) -> None:
    group = spec.rollout.group_size
    for edge, items in chosen.granularity.items():
        assert items % group == 0, f"{edge} carries {items} items, not whole groups of {group}"
    for name, items in chosen.micro_batch.items():
        assert items % group == 0, f"{name} micro-batch {items} is not whole groups"
    ranks = {c.component: c.num_devices for c in chosen.placement}
    assert ranks["actor"] % spec.actor_model_parallel == 0, "whole model-parallel groups"
    flow = declare(spec)
    items = flow.items()
    for c in flow.channels:  # as FlowRun.step checks them: raises ConfigError on idle ranks
        dst = c.edge.dst
        FlowChannel(src=c.edge.src, dst=dst, name=c.key, store="-", consumer_ranks=ranks[dst],
                    sharding=flow.component(dst).worker.input_sharding,
                    unit=flow.unit_of(c)).check_shards(items[dst])
    check_micro_batches(reasoning_workflow(spec), chosen.micro_batch, devices=ranks)


@st.composite
def cases(draw: st.DrawFn) -> tuple[FlowSpec, AnalyticCostModel, Cluster]:
    group = draw(st.integers(2, 8))
    spec = FlowSpec(rollout=RolloutGeneratorConfig(
                        group_size=group, groups_per_micro_batch=draw(st.integers(1, 4))),
                    prompts_per_step=draw(st.integers(1, 24)),
                    recompute_logprobs=draw(st.booleans()),
                    # a trainer cut in two: plans move whole model-parallel groups
                    megatron=draw(st.sampled_from([None, MegatronConfig(tensor_parallel=2)])))
    cost = AnalyticCostModel({
        "rollout": AnalyticCost(fixed=0.5, per_item=draw(st.floats(0.01, 0.5)), tail=0.1,
                                replicated=40 * GIB, switch=draw(st.floats(0.1, 3.0))),
        "reward": AnalyticCost(fixed=draw(st.sampled_from([0.0, 0.05])), per_item=0.002),
        "inference": AnalyticCost(fixed=draw(st.sampled_from([0.0, 0.2])),
                                  per_item=draw(st.floats(0.001, 0.1)), replicated=8 * GIB,
                                  switch=1.0),
        "actor": AnalyticCost(fixed=draw(st.sampled_from([0.0, 0.3])),
                              per_item=draw(st.floats(0.003, 0.3)),
                              sync=draw(st.sampled_from([0.0, 0.1])), replicated=30 * GIB,
                              switch=2.0),
    })
    return spec, cost, Cluster.uniform(1, draw(st.integers(1, 6)), "80GiB", "H100")


@settings(max_examples=25, deadline=None, derandomize=True, database=None,
          suppress_health_check=[HealthCheck.too_slow])
@given(cases())
def test_every_plan_of_auto_moves_whole_groups(
        case: tuple[FlowSpec, AnalyticCostModel, Cluster]) -> None:
    spec, cost, cluster = case
    result = plan(reasoning_workflow(spec), cost, cluster)
    for chosen in (*result.ranked, *result.baselines.values()):
        assert_runs_as_planned(spec, chosen)


def test_few_prompts_keep_actor_ranks_fed() -> None:
    # 3 prompts of 8 responses on 8 devices: 24 items could feed 8 ranks one response each,
    # but a rank trains whole groups, so no role gets more than 3 devices.
    spec = FlowSpec(rollout=RolloutGeneratorConfig(group_size=8, groups_per_micro_batch=1),
                    prompts_per_step=3)
    cost = AnalyticCostModel({n: AnalyticCost(fixed=0.1, per_item=0.1, replicated=GIB)
                              for n in ("rollout", "reward", "inference", "actor")})
    result = plan(reasoning_workflow(spec), cost, Cluster.uniform(1, 8, "80GiB", "H100"))
    for chosen in (*result.ranked, *result.baselines.values()):
        assert max(c.num_devices for c in chosen.placement) <= 3
        assert_runs_as_planned(spec, chosen)


def _profile(*, actor: AnalyticCost | None = None, devices: tuple[int, ...] = (1, 2)) -> Profile:
    """Every component "measured" at 8 and 32 items on `devices` from a known cost model;
    `actor` replaces the default actor cost."""
    analytic = AnalyticCostModel({
        "rollout": AnalyticCost(fixed=0.05, per_item=0.01), "reward": AnalyticCost(per_item=0.001),
        "inference": AnalyticCost(per_item=0.004),
        "actor": actor or AnalyticCost(per_item=0.006)})
    return Profile(tuple(
        Measurement(c, b, n, analytic.time(c, batch_size=b, num_devices=n), 0, "none")
        for c in ("rollout", "reward", "inference", "actor") for b in (8, 32) for n in devices))


def test_predictions_fit_the_message_latency_to_the_pipelined_probe_and_add_the_weight_sync(
) -> None:
    spec = FlowSpec(rollout=RolloutGeneratorConfig(group_size=4, groups_per_micro_batch=2),
                    prompts_per_step=8)
    base = _profile()
    box = Cluster.uniform(1, 2, "8GiB", "cpu", cpus_per_node=2)
    probe = fixed_plan(spec, "rollout: 0, reward,inference,actor: 1", num_devices=2,
                       granularity_groups=2)
    # What the probe "measured": its simulation where every message costs 10 ms.
    hops = dataclasses.replace(box, message_latency=0.01)
    measured = ReasoningPricing(spec).price(probe, ProfileCosts(base), hops)[0].predicted_time
    assert measured > ReasoningPricing(spec).price(probe, ProfileCosts(base), box)[0].predicted_time
    profile = base.merge(Profile(
        (Measurement(PROBE_ITERATION, 32, 2, measured, 0, "none"),
         Measurement(WEIGHT_SYNC, 1, 1, 0.05, 0, "none")),
        metadata={"probe_plan": probe.to_dict()}))
    # List scheduling is not monotone in the latency: another latency may give the same time.
    fitted = ReasoningPricing(spec).calibrated(box, profile)
    assert fitted.message_latency == pytest.approx(0.01, rel=0.3)
    assert ReasoningPricing(spec).price(probe, profile, box)[0].predicted_time == pytest.approx(
        measured + 0.05, rel=1e-3)
    # any plan is priced on the calibrated cluster, plus the weight sync
    together = fixed_plan(spec, "rollout,reward,inference,actor: 0-1", num_devices=2,
                          granularity_groups=2)
    assert ReasoningPricing(spec).price(together, profile, box)[0].predicted_time == pytest.approx(
        ReasoningPricing(spec).price(together, ProfileCosts(base), fitted)[0].predicted_time + 0.05)
    # without a pipelined probe (a cached profile from before, a GPU cluster) nothing changes
    assert ReasoningPricing(spec).calibrated(box, base) == box


def test_a_streaming_actor_pays_its_fixed_part_once_per_iteration() -> None:
    # Hybrid: the actor trains each 8-row micro-batch as it arrives and steps once, so
    # its 4 pieces together cost one whole-batch call: 1 s fixed + 32 x 0.01 s, not 4 s fixed.
    spec = FlowSpec(rollout=RolloutGeneratorConfig(group_size=4, groups_per_micro_batch=2),
                    prompts_per_step=8)
    spec = dataclasses.replace(spec, actor=dataclasses.replace(spec.actor, micro_batch_size=8))
    profile = _profile(actor=AnalyticCost(fixed=1.0, per_item=0.01))
    box = Cluster.uniform(1, 2, "8GiB", "cpu", cpus_per_node=2)
    hybrid = fixed_plan(spec, "rollout: 0, reward,inference,actor: 1", num_devices=2,
                        granularity_groups=2)
    _, simulation = ReasoningPricing(spec).price(hybrid, profile, box)
    assert simulation.busy_seconds["actor"] == pytest.approx(1.0 + 32 * 0.01, rel=1e-6)
    actor_calls = [i for i in simulation.intervals if i.component == "actor"]
    assert len(actor_calls) == 4
    # Collocated, the actor trains the whole batch in one call: the same price.
    together = fixed_plan(spec, "rollout,reward,inference,actor: 0", num_devices=2,
                          granularity_groups=2)
    _, simulation = ReasoningPricing(spec).price(together, profile, box)
    assert simulation.busy_seconds["actor"] == pytest.approx(1.0 + 32 * 0.01, rel=1e-6)


def _cut_choosing_spec() -> FlowSpec:
    return FlowSpec(model=ModelSource(config=TinyLMConfig()), megatron=MegatronConfig(),
                    choose_cut=True,
                    rollout=RolloutGeneratorConfig(group_size=4, groups_per_micro_batch=2),
                    prompts_per_step=8)


def _measured(spec: FlowSpec) -> Profile:
    """A profile of every component on 1, 2 and 4 devices (the actor data parallel)."""
    return _profile(devices=(1, 2, 4))


def test_auto_chooses_the_actors_cut_under_the_device_memory() -> None:
    """``actor.cut=auto``: with room for a replica per device the actor stays data
    parallel; with device memory below a replica's need (as `TrainerCost` models it) every
    plan's actor is cut by tensor or pipeline parallelism, and the flow runs that cut."""
    spec = _cut_choosing_spec()
    profile = _measured(spec)
    roomy = Cluster.uniform(1, 4, "8GiB", "cpu", cpus_per_node=4)
    chosen = ReasoningPricing(spec).rank(profile, roomy).plan
    cut = chosen.parallelism["actor"]
    assert (cut["tensor"], cut["pipeline"]) == (1, 1)
    assert cut["data"] == len(chosen.placement.components["actor"].devices)
    # Device memory between what a tensor-parallel cut and a replica need.
    trainer = trainer_cost(spec, ProfileCosts(profile), roomy)
    batch = spec.prompts_per_step * spec.rollout.group_size
    replica = trainer.memory_of(ParallelCut(1, 1, 2, distributed_optimizer=True), batch)
    split = trainer.memory_of(ParallelCut(2, 1, 1, sequence_parallel=True), batch)
    assert split < replica
    tight = Cluster.uniform(1, 4, int((split + replica) / 2), "cpu", cpus_per_node=4)
    choice = ReasoningPricing(spec).rank(profile, tight)
    for candidate in (*choice.ranked.ranked, *choice.ranked.baselines.values()):
        cut = candidate.parallelism["actor"]
        assert cut["tensor"] * cut["pipeline"] >= 2, candidate.spec
    cut = choice.plan.parallelism["actor"]
    megatron = spec.for_plan(choice.plan).megatron
    assert megatron is not None
    assert (megatron.tensor_parallel, megatron.pipeline_parallel) == (cut["tensor"],
                                                                       cut["pipeline"])
    assert megatron.sequence_parallel == (cut["tensor"] > 1)
    assert declare(spec.for_plan(choice.plan)).component("actor").component.device_multiple \
        == cut["tensor"] * cut["pipeline"]
    # A spec that does not choose its cut runs as configured whatever the plan says.
    fixed = dataclasses.replace(spec, choose_cut=False)
    assert fixed.for_plan(choice.plan) is fixed
