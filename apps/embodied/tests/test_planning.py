"""`auto` planning proposes only plans the embodied flow launches exactly (no Ray needed).

`EmbodiedFlow.launch` runs the env's micro-batch as stage groups (`_stages_of`: it must
divide ``num_envs``), the policy on the same stage groups, env and policy as one process
on one device each, and the actor once on the whole rollout. The planner must never
propose anything else, whatever the env count, steps and devices.
"""

from __future__ import annotations

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from rlinf_embodied.flow import EmbodiedSpec, _stages_of, embodied_workflow

from rlinf.sched import AnalyticCost, AnalyticCostModel, Cluster, ExecutionPlan, plan
from rlinf.sched.granularity import check_micro_batches
from rlinf.workers.embodied.actor import EmbodiedActorConfig
from rlinf.workers.env import EnvWorkerConfig
from rlinf.workers.models.policy import PolicyConfig


def spec_of(num_envs: int, steps: int) -> EmbodiedSpec:
    return EmbodiedSpec(env=EnvWorkerConfig("InvertedPendulum-v5", num_envs=num_envs),
                        policy=PolicyConfig(obs_shape=(4,), action_dim=1),
                        actor=EmbodiedActorConfig(), rollout_steps=steps)


def assert_launchable(spec: EmbodiedSpec, chosen: ExecutionPlan) -> None:
    """What `EmbodiedFlow.launch` checks before it starts a worker, and the env stage groups
    it then builds, plus the workflow's declarations."""
    for name in ("env", "rollout"):
        assert len(chosen.placement.devices_of(name)) == 1
        assert chosen.placement.procs_per_device(name) == 1
    stages = _stages_of(spec, chosen)  # raises ConfigError unless it divides num_envs
    EnvWorkerConfig(spec.env.env_name, num_envs=spec.env.num_envs, pipeline_stages=stages)
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
