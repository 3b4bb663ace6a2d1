"""Re-planning when measured times drift from the plan's prediction."""

from __future__ import annotations

import math

import pytest

from rlinf.sched.analytic_costs import AnalyticCost, AnalyticCostModel
from rlinf.sched.cluster import Cluster
from rlinf.sched.costs import CostModel
from rlinf.sched.errors import PlanningError
from rlinf.sched.execution_plan import ExecutionPlan
from rlinf.sched.planner import PlannerOptions, plan
from rlinf.sched.replan import Call, DriftPolicy, LiveCostModel, Replanner, switch_pays
from rlinf.sched.simulator import simulate
from rlinf.sched.workflow import Component, Edge, Workflow

WF = Workflow((Component("rollout"), Component("actor")), (Edge("rollout", "actor"),),
              global_batch=16)
CLUSTER = Cluster.uniform(1, 4, 100, "H100")


def costs(actor_per_item: float) -> AnalyticCostModel:
    # each needs 60 of a device's 100 bytes: sharing devices costs a switch every turn
    return AnalyticCostModel({
        "rollout": AnalyticCost(per_item=1.0, fixed=0.2, replicated=60, switch=2.0),
        "actor": AnalyticCost(per_item=actor_per_item, fixed=0.2, replicated=60, switch=2.0)})


def planner(workflow: Workflow, cost: CostModel, cluster: Cluster):  # type: ignore[no-untyped-def]
    return plan(workflow, cost, cluster, options=PlannerOptions(keep=1))


def run_iteration(p: ExecutionPlan, truth: CostModel) -> tuple[float, dict[str, list[Call]]]:
    """What a runtime would measure: the plan executed under the true costs."""
    seconds = simulate(WF, p.placement, truth, CLUSTER, micro_batch=p.micro_batch).iteration_time
    calls: dict[str, list[Call]] = {}
    for name in WF.names:
        size, n = p.micro_batch[name], len(p.placement.devices_of(name))
        calls[name] = [Call(size, n, truth.time(name, batch_size=size, num_devices=n))
                       for _ in range(math.ceil(WF.batch_of(name) / size))]
    return seconds, calls


def test_a_component_that_doubles_its_cost_mid_run_triggers_a_faster_plan() -> None:
    before, after = costs(1.0), costs(4.0)
    first = planner(WF, before, CLUSTER).best
    replanner = Replanner(WF, CLUSTER, first, before, planner=planner,
                          policy=DriftPolicy(patience=2))
    stay = adaptive = 0.0
    decisions = []
    current = first
    for it in range(12):
        truth = before if it < 4 else after
        stay += run_iteration(first, truth)[0]
        seconds, calls = run_iteration(current, truth)
        adaptive += seconds
        decision = replanner.observe(it, seconds=seconds, calls=calls)
        if decision is not None:
            decisions.append(decision)
            current = decision.plan  # switch at the iteration boundary
    assert [d.iteration for d in decisions] == [5]  # drift from iteration 4, patience 2
    (d,) = decisions
    assert d.adopted and d.corrections["actor"] == pytest.approx(4.0 / 1.0, rel=0.2)
    assert d.predicted_new < d.repriced_current
    assert len(d.plan.placement.devices_of("actor")) > len(first.placement.devices_of("actor"))
    assert adaptive < stay  # re-planning paid off over the run
    # after re-planning, the prediction tracks the run again: no second re-plan fired
    assert replanner.predicted == pytest.approx(run_iteration(current, after)[0], rel=0.15)


def test_noise_below_the_threshold_or_shorter_than_patience_does_not_replan() -> None:
    cost = costs(1.0)
    first = planner(WF, cost, CLUSTER).best
    replanner = Replanner(WF, CLUSTER, first, cost, planner=planner,
                          policy=DriftPolicy(threshold=0.2, patience=3))
    _, calls = run_iteration(first, cost)
    for it, factor in enumerate([1.1, 0.9, 1.5, 1.5, 1.0, 1.5, 1.5]):
        assert replanner.observe(it, seconds=first.predicted_time * factor, calls=calls) is None


def test_drift_without_a_better_plan_refreshes_the_prediction() -> None:
    # every component 30% slower: the same plan stays best, its prediction is refreshed.
    cost, slow = costs(1.0), LiveCostModel(costs(1.0), {"rollout": 1.3, "actor": 1.3})
    first = planner(WF, cost, CLUSTER).best
    replanner = Replanner(WF, CLUSTER, first, cost, planner=planner,
                          policy=DriftPolicy(patience=1))
    seconds, calls = run_iteration(first, slow)
    decision = replanner.observe(0, seconds=seconds, calls=calls)
    assert decision is not None and not decision.adopted
    assert decision.plan is first
    assert replanner.predicted == pytest.approx(seconds, rel=1e-6)
    assert replanner.observe(1, seconds=seconds, calls=calls) is None
    assert decision.to_dict()["adopted"] is False


def test_bad_observations_and_policies_are_refused() -> None:
    cost = costs(1.0)
    first = planner(WF, cost, CLUSTER).best
    replanner = Replanner(WF, CLUSTER, first, cost, planner=planner)
    with pytest.raises(PlanningError, match="not a component"):
        replanner.observe(0, seconds=1.0, calls={"critic": [Call(1, 1, 1.0)]})
    with pytest.raises(PlanningError, match="expected > 0"):
        replanner.observe(0, seconds=0.0, calls={})
    with pytest.raises(PlanningError, match="threshold"):
        DriftPolicy(threshold=0)
    with pytest.raises(PlanningError, match="patience"):
        DriftPolicy(patience=0)


def test_busy_seconds_give_the_same_corrections_as_calls() -> None:
    before, after = costs(1.0), costs(4.0)
    first = planner(WF, before, CLUSTER).best
    replanner = Replanner(WF, CLUSTER, first, before, planner=planner,
                          policy=DriftPolicy(patience=1))
    truth = simulate(WF, first.placement, after, CLUSTER, micro_batch=first.micro_batch)
    decision = replanner.observe(0, seconds=truth.iteration_time, busy=truth.busy_seconds)
    assert decision is not None and decision.adopted
    assert decision.corrections["rollout"] == pytest.approx(1.0)
    base = simulate(WF, first.placement, before, CLUSTER, micro_batch=first.micro_batch)
    expected = truth.busy_seconds["actor"] / base.busy_seconds["actor"]  # fixed terms included
    assert decision.corrections["actor"] == pytest.approx(expected) and expected > 3
    with pytest.raises(PlanningError, match="not a component"):
        replanner.observe(1, seconds=1.0, busy={"critic": 1.0})


@pytest.mark.parametrize(("current", "candidate", "steps_left", "switch_s", "pays"), [
    (1.0, 0.5, 100, 10.0, True),     # 50 s saved for a 10 s relaunch
    (1.0, 0.5, 10, 10.0, False),     # 5 s saved: the relaunch costs more
    (1.0, 0.97, 10_000, 1.0, False),  # 3% faster: below min_gain, however long the run
    (1.0, 1.2, 100, 0.0, False),     # slower
    (1.0, 0.5, 0, 0.0, False),       # nothing left to run
    (0.0, 0.5, 100, 0.0, False),     # an unpriced plan
])
def test_a_switch_pays_when_its_saving_over_the_steps_left_exceeds_its_cost(
        current: float, candidate: float, steps_left: int, switch_s: float,
        pays: bool) -> None:
    assert switch_pays(current, candidate, steps_left=steps_left, switch_s=switch_s) is pays
