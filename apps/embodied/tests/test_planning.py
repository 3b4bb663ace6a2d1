"""`auto` planning proposes only plans the embodied flow launches exactly (no Ray needed).

`EmbodiedFlow.launch` runs the env's micro-batch as stage groups (`stages_of`: it must
divide ``num_envs``), one env worker per env device splitting every group evenly
(`EnvWorkerConfig.shard`), the policy on the same stage groups with one process per device
serving whole env workers (its device count divides the env's), and the actor once on the
whole rollout. The planner must never propose anything else, whatever the env count, steps
and devices.
"""

from __future__ import annotations

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from rlinf_embodied.pricing import EmbodiedPricing, profile_batch_sizes
from rlinf_embodied.pricing import fixed_plan as planned_fixed
from rlinf_embodied.workflow import EmbodiedSpec, embodied_workflow, stages_of

from rlinf.sched import (
    AnalyticCost,
    AnalyticCostModel,
    Cluster,
    ExecutionPlan,
    Measurement,
    Profile,
    Workflow,
    parse_placement,
    plan,
)
from rlinf.sched.granularity import check_micro_batches
from rlinf.workers.embodied.actor import EmbodiedActorConfig
from rlinf.workers.env import EnvWorkerConfig
from rlinf.workers.flow.auto import overhead_seconds
from rlinf.workers.models.policy import PolicyConfig
from rlinf.workers.training.pricing import calibrated_link, fitted_turns, link_cluster

LINK = {"component": "link", "edge": "env->rollout"}
"""Where `EmbodiedFlow.measure` records the env ↔ policy link's round trips."""


def seconds(plan_: ExecutionPlan, workflow: Workflow, cost: AnalyticCostModel,
            cluster: Cluster) -> float:
    """The simulated iteration of `plan_` as the embodied flow runs it."""
    return EmbodiedPricing(workflow).simulation(plan_, cost, cluster).iteration_time


def spec_of(num_envs: int, steps: int) -> EmbodiedSpec:
    return EmbodiedSpec(env=EnvWorkerConfig("InvertedPendulum-v5", num_envs=num_envs),
                        policy=PolicyConfig(obs_shape=(4,), action_dim=1),
                        actor=EmbodiedActorConfig(), rollout_steps=steps)


def assert_launchable(spec: EmbodiedSpec, chosen: ExecutionPlan) -> None:
    """What `EmbodiedFlow.launch` checks before it starts a worker, and the env stage groups
    it then builds, plus the workflow's declarations."""
    for name in ("env", "rollout"):
        assert chosen.placement.procs_per_device(name) == 1
    workers = len(chosen.placement.devices_of("env"))
    assert workers % len(chosen.placement.devices_of("rollout")) == 0  # p2p pairs whole workers
    stages = stages_of(spec, chosen)  # raises ConfigError unless it divides num_envs
    run = EnvWorkerConfig(spec.env.env_name, num_envs=spec.env.num_envs,
                          pipeline_stages=stages)
    for rank in range(workers):
        run.shard(rank, workers)  # raises ConfigError unless every worker gets whole envs
    assert chosen.micro_batch["rollout"] == chosen.micro_batch["env"]
    assert chosen.micro_batch["actor"] == spec.samples_per_iteration
    check_micro_batches(embodied_workflow(spec), chosen.micro_batch,
                        devices={c.component: c.num_devices for c in chosen.placement})


def test_twenty_envs_never_get_a_stage_group_of_three() -> None:
    # 20 envs split "in 8" used to give micro-batches of ceil(20 / 8) = 3, which the launch
    # refused; now only divisors of 20 are proposed.
    spec = spec_of(20, 8)
    cost = AnalyticCostModel({"env": AnalyticCost(fixed=0.002, per_item=0.004),
                              "rollout": AnalyticCost(fixed=0.01, per_item=0.0002),
                              "actor": AnalyticCost(fixed=0.2, per_item=1e-4)})
    result = plan(embodied_workflow(spec), cost, Cluster.uniform(1, 3, "8GB", "cpu"))
    for chosen in (*result.ranked, *result.baselines.values()):
        assert 20 % chosen.micro_batch["env"] == 0
        assert_launchable(spec, chosen)


@st.composite
def cases(draw: st.DrawFn) -> tuple[EmbodiedSpec, AnalyticCostModel, Cluster]:
    spec = spec_of(draw(st.integers(1, 48)), draw(st.integers(1, 6)))
    cost = AnalyticCostModel({
        "env": AnalyticCost(fixed=draw(st.sampled_from([0.0, 0.002, 0.02])),
                            per_item=draw(st.floats(1e-4, 1e-2)),
                            serial_per_item=draw(st.sampled_from([0.0, 1e-4]))),
        "rollout": AnalyticCost(fixed=draw(st.sampled_from([0.0, 0.005, 0.05])),
                                per_item=draw(st.floats(1e-5, 1e-2))),
        "actor": AnalyticCost(fixed=0.1, per_item=draw(st.floats(1e-5, 1e-3)),
                              sync=draw(st.sampled_from([0.0, 0.05]))),
    })
    devices = draw(st.integers(1, 5))
    return spec, cost, Cluster.uniform(1, devices, "8GB", "cpu")


@settings(max_examples=25, deadline=None, derandomize=True, database=None,
          suppress_health_check=[HealthCheck.too_slow])
@given(cases())
def test_every_plan_of_auto_launches_as_planned(
        case: tuple[EmbodiedSpec, AnalyticCostModel, Cluster]) -> None:
    spec, cost, cluster = case
    result = plan(embodied_workflow(spec), cost, cluster)
    for chosen in (*result.ranked, *result.baselines.values()):
        assert_launchable(spec, chosen)


def test_link_round_trips_fit_a_latency_per_message_and_a_bandwidth() -> None:
    spec = spec_of(16, 8)
    workflow = embodied_workflow(spec)
    cluster = Cluster.discover(use_ray=False, cpu_slots=2, gpus=False)
    echoed = 2 * next(e.bytes_per_item for e in workflow.edges if e.key == "env->rollout")
    # 1 ms per round trip at any size plus 1 µs per env: latency 0.5 ms, 1 µs per echo
    link = [Measurement("link", s, 1, 1e-3 + 1e-6 * s, 0, memory_source="none", timestamp=0.0)
            for s in (4, 16)]
    fitted = link_cluster(cluster, workflow, Profile(tuple(link)), **LINK)
    assert fitted.intra_node_latency == pytest.approx(5e-4)
    assert fitted.intra_node_bandwidth == pytest.approx(echoed / 1e-6)
    # one size: all of the round trip is latency; no link measured: the cluster as it was
    single = link_cluster(cluster, workflow, Profile(tuple(link[:1])), **LINK)
    assert single.intra_node_latency == pytest.approx((1e-3 + 4e-6) / 2)
    assert single.intra_node_bandwidth == cluster.intra_node_bandwidth
    assert link_cluster(cluster, workflow, Profile(()), **LINK) == cluster
    # priced with the link, a plan that pipelines env and policy apart pays its messages:
    # a stage group's chain crosses the link twice a step, the other group's compute hides
    # the rest, so at least 2 latencies per step after the first are exposed
    cost = AnalyticCostModel({"env": AnalyticCost(per_item=1e-4),
                              "rollout": AnalyticCost(per_item=1e-4),
                              "actor": AnalyticCost(per_item=1e-5)})
    apart = planned_fixed(parse_placement("env: 0, rollout: 1, actor: 0-1",
                                          components=workflow.names, num_devices=2),
                          workflow, pipeline_stages=2)
    free = seconds(apart, workflow, cost, cluster)
    paid = seconds(apart, workflow, cost, fitted)
    assert paid - free >= (8 - 1) * 2 * 5e-4 * 0.95


def test_the_iteration_overhead_is_the_measured_weight_sync_and_control() -> None:
    def point(name: str, seconds: float) -> Measurement:
        return Measurement(name, 1, 1, seconds, 0, memory_source="none", timestamp=0.0)

    profile = Profile((point("weight_sync", 0.004), point("weight_sync", 0.006),
                       point("control", 0.01), point("env", 1.0)))
    assert overhead_seconds(profile, EmbodiedPricing.overheads) == pytest.approx(0.005 + 0.01)
    assert overhead_seconds(Profile(()), EmbodiedPricing.overheads) == 0.0


def _calibration_case() -> tuple[Workflow, Cluster, AnalyticCostModel, ExecutionPlan]:
    """16 envs x 8 steps in 2 stage groups on 2 CPU slots, analytic costs, and the
    collocated plan on device 0."""
    workflow = embodied_workflow(spec_of(16, 8))
    cost = AnalyticCostModel({"env": AnalyticCost(per_item=2e-4),
                              "rollout": AnalyticCost(per_item=2e-4),
                              "actor": AnalyticCost(per_item=1e-4)})
    collocated = planned_fixed(parse_placement("env, rollout, actor: 0",
                                               components=workflow.names, num_devices=2),
                               workflow, pipeline_stages=2)
    return workflow, Cluster.discover(use_ray=False, cpu_slots=2, gpus=False), cost, collocated


def test_the_link_is_calibrated_to_the_iterations_the_profiling_flow_ran() -> None:
    """A probe plan simulated at 0.10 s whose dataflow ran 0.15 s: the latency per message
    rises until the simulation gives 0.15 s; a collocated plan's price
    does not move, a pipelined plan's rises. Never lowered; no probe, no change."""
    workflow, cluster, cost, collocated = _calibration_case()
    probe = planned_fixed(parse_placement("env, actor: 0, rollout: 1", components=workflow.names,
                                          num_devices=2), workflow, pipeline_stages=2)
    before = seconds(probe, workflow, cost, cluster)

    def profile_of(seconds: float) -> Profile:
        point = Measurement("probe_iteration", 16, 1, seconds, 0, memory_source="none",
                            timestamp=0.0)
        return Profile((point,), metadata={"probe_plan": probe.to_dict()})

    calibrated = calibrated_link(cluster, workflow, profile_of(before * 1.5), cost)
    assert calibrated.intra_node_latency > cluster.intra_node_latency
    after = seconds(probe, workflow, cost, calibrated)
    assert after == pytest.approx(before * 1.5, rel=1e-3)
    assert seconds(collocated, workflow, cost, calibrated) == \
        pytest.approx(seconds(collocated, workflow, cost, cluster))
    # faster than simulated: the fitted link stays; no probe: unchanged
    assert calibrated_link(cluster, workflow, profile_of(before * 0.5), cost) == cluster
    assert calibrated_link(cluster, workflow, Profile(()), cost) == cluster


def test_the_hand_overs_are_fitted_to_the_iterations_of_an_inline_policy() -> None:
    """A collocated probe simulated at T whose dataflow ran T + 0.02 s: the
    turn latency rises until its two hand-overs per iteration (to the env at the start, to
    the actor after the rollout; none between env and its inline policy) take 0.02 s, so
    the same plan is then priced as it ran; the pipelined probe's link is calibrated after
    them. Never lowered; without such iterations, unchanged."""
    workflow, cluster, cost, collocated = _calibration_case()
    # The probe ran on one device; the same plan on the cluster's two is what is priced.
    probe = planned_fixed(parse_placement("collocated", components=workflow.names,
                                          num_devices=1), workflow, pipeline_stages=2)
    before = seconds(collocated, workflow, cost, cluster)

    def profile_of(seconds: float) -> Profile:
        points = tuple(Measurement("collocated_iteration", 16, 1, seconds, 0,
                                   memory_source="none", timestamp=0.0) for _ in range(2))
        return Profile(points, metadata={"collocated_probe_plans": {"1": probe.to_dict()}})

    turned = fitted_turns(cluster, workflow, profile_of(before + 0.02), cost)
    assert turned.turn_latency == pytest.approx(0.01, rel=1e-3)
    assert seconds(collocated, workflow, cost, turned) == pytest.approx(
        before + 0.02, rel=1e-3)
    assert fitted_turns(cluster, workflow, profile_of(before * 0.5), cost) == cluster
    assert fitted_turns(cluster, workflow, Profile(()), cost) == cluster


def test_the_profile_measures_one_env_so_small_groups_are_priced_not_extrapolated() -> None:
    assert profile_batch_sizes(32, 2) == (1, 16, 32)
    assert profile_batch_sizes(8, 1) == (1, 8)
    assert profile_batch_sizes(1, 1) == (1,)


def test_with_a_policy_lag_auto_gives_the_actor_a_device_of_its_own() -> None:
    """A rollout and an update of about equal cost: synchronous, they run one after the
    other; lagged, the actor on a device of its own overlaps the next rollout, and the
    planner prices the iteration at the longer of the two."""
    synchronous = spec_of(16, 64)
    lagged = EmbodiedSpec(env=synchronous.env, policy=synchronous.policy,
                          actor=EmbodiedActorConfig(policy_lag=1), rollout_steps=64)
    workflow = embodied_workflow(lagged)
    assert [e.key for e in workflow.edges if e.lagged] == ["env->actor"]
    assert not any(e.lagged for e in embodied_workflow(synchronous).edges)
    # Simulation that more env workers do not speed up (serial): otherwise two env workers
    # with the actor after them on both devices beat the overlap (0.88 s against 1.0 s).
    cost = AnalyticCostModel({"env": AnalyticCost(serial_per_item=0.01 / 16),
                              "rollout": AnalyticCost(serial_per_item=0.002 / 16),
                              "actor": AnalyticCost(per_item=1.0 / 1024)})
    cluster = Cluster.uniform(1, 2, 8 << 30, "cpu")
    best = plan(workflow, cost, cluster).best
    assert set(best.placement.devices_of("actor")).isdisjoint(
        best.placement.devices_of("env"))
    rollout_s, update_s = 64 * (0.01 + 0.002), 1.0
    assert best.predicted_time == pytest.approx(max(rollout_s, update_s), rel=0.05)
    # synchronous, the update waits for the rollout whatever the placement (the best: the
    # rollout pipelined over both devices, then the update on both, 1.14 s)
    assert plan(embodied_workflow(synchronous), cost, cluster).best.predicted_time > (
        1.1 * best.predicted_time)
    assert_launchable(lagged, best)


def test_the_trainer_waits_for_a_whole_rollout_and_the_links_for_one_micro_batch() -> None:
    """A slow simulator's rollout (a LIBERO episode: 220 steps, over 120 s here) must not
    time out the trainer's wait for its trajectory, while env and policy keep the
    per-micro-batch bound that catches a dead peer."""
    from rlinf_embodied.workflow import declare

    from rlinf.workers.embodied.rollout import PolicyRolloutConfig

    spec = spec_of(4, 220)
    rollout = PolicyRolloutConfig(policy=spec.policy)
    flow = declare(spec, stages=2, rollout=rollout, actor=spec.actor)
    timeouts = {c.component.name: c.init_kwargs["io_timeout"] for c in flow.components}
    assert timeouts["actor"] == spec.rollout_timeout == spec.link_timeout * 222
    assert timeouts["env"] == timeouts["rollout"] == spec.link_timeout
