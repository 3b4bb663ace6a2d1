"""Exact search: branch and bound equals brute force; the planner finds the step-1 optimum."""

from __future__ import annotations

import itertools

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from rlinf.sched.analytic_costs import AnalyticCost, AnalyticCostModel
from rlinf.sched.cluster import Cluster
from rlinf.sched.errors import PlanningError
from rlinf.sched.granularity import check_micro_batches
from rlinf.sched.placement import parse_placement
from rlinf.sched.planner import (
    Evaluator,
    PlannerOptions,
    branch_and_bound,
    exhaustive_search,
    plan,
)
from rlinf.sched.simulator import simulate
from rlinf.sched.workflow import Component, Edge, Loop, Workflow

MEM = 100

costs = st.builds(
    AnalyticCost,
    fixed=st.sampled_from([0.0, 0.2, 1.0]),
    per_item=st.floats(0.05, 2.0),
    serial_per_item=st.sampled_from([0.0, 0.0, 0.05]),
    sync=st.sampled_from([0.0, 0.3]),
    replicated=st.sampled_from([10, 40, 60]),
    switch=st.floats(0.0, 3.0),
)


@st.composite
def workloads(draw: st.DrawFn) -> tuple[Workflow, AnalyticCostModel, Cluster]:
    """Chains of 2–4 components (streaming head, CPU members, TP multiples, micro-batch units
    and divisors) or an env ↔ policy loop (the policy maybe on the env's micro-batch) feeding
    a trainer (maybe whole-batch only), on 2–6 devices (fewer for more components), one or
    two nodes."""
    if draw(st.booleans()):
        ncomp = draw(st.integers(2, 4))
        names = [f"c{i}" for i in range(ncomp)]
        streaming = draw(st.booleans())
        comps = tuple(
            Component(n, resource=draw(st.sampled_from(["gpu", "gpu", "cpu"])),
                      streaming=streaming and i == 0,
                      completion=((0.5, 0.25), (1.0, 1.0)) if streaming and i == 0
                      else ((1.0, 1.0),),
                      device_multiple=draw(st.sampled_from([1, 1, 2])),
                      micro_batch_multiple=draw(st.sampled_from([1, 1, 2])),
                      micro_batch_divides=draw(st.booleans()))
            for i, n in enumerate(names))
        edges = tuple(Edge(a, b, bytes_per_item=draw(st.sampled_from([0.0, 1e9])))
                      for a, b in itertools.pairwise(names))
        wf = Workflow(comps, edges, global_batch=draw(st.sampled_from([4, 8])))
    else:
        names = ["env", "rollout", "actor"]
        wf = Workflow(
            (Component("env", resource=draw(st.sampled_from(["cpu", "gpu"])),
                       micro_batch_divides=draw(st.booleans())),
             Component("rollout", same_micro_batch_as="env" if draw(st.booleans()) else None),
             Component("actor", whole_batch=draw(st.booleans()))),
            (Edge("env", "rollout", bytes_per_item=draw(st.sampled_from([0.0, 1e8]))),
             Edge("rollout", "env", feedback=True), Edge("rollout", "actor")),
            global_batch=8, loops=(Loop(("env", "rollout"), draw(st.sampled_from([2, 3]))),))
    cost = AnalyticCostModel({n: draw(costs) for n in names})
    # Brute force simulates (ranges × micro-batch combinations): keep it to ~10⁴.
    devices = draw(st.sampled_from({2: [2, 4, 5, 6], 3: [2, 3, 4], 4: [2]}[len(names)]))
    nodes = 2 if devices % 2 == 0 and draw(st.booleans()) else 1
    return wf, cost, Cluster.uniform(nodes, devices // nodes, MEM, "H100",
                                     intra_node_bandwidth=1e10, inter_node_bandwidth=1e9)


def _times(wf: Workflow, cost: AnalyticCostModel, cl: Cluster, *, prune: bool,
           keep: int) -> list[float]:
    try:
        result = exhaustive_search(wf, cost, cl, max_chunks=4, keep=keep, prune=prune)
    except PlanningError:
        return []
    return [p.predicted_time for p in result.ranked]


@settings(max_examples=15, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(workloads())
def test_pruned_exhaustive_equals_unpruned(
    case: tuple[Workflow, AnalyticCostModel, Cluster],
) -> None:
    wf, cost, cl = case
    full = _times(wf, cost, cl, prune=False, keep=3)
    pruned = _times(wf, cost, cl, prune=True, keep=3)
    assert pruned == pytest.approx(full, rel=1e-9)


@settings(max_examples=15, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(workloads())
def test_planner_finds_the_step_one_optimum(
    case: tuple[Workflow, AnalyticCostModel, Cluster],
) -> None:
    wf, cost, cl = case
    try:
        exact = exhaustive_search(wf, cost, cl, max_chunks=4, keep=1, prune=False)
    except PlanningError:
        with pytest.raises(PlanningError):
            plan(wf, cost, cl, options=PlannerOptions(max_chunks=4))
        return
    planned = plan(wf, cost, cl, options=PlannerOptions(max_chunks=4))
    assert planned.best.predicted_time == pytest.approx(exact.best.predicted_time, rel=1e-9)
    sim = simulate(wf, planned.best.placement, cost, cl, micro_batch=planned.best.micro_batch)
    assert sim.iteration_time == pytest.approx(planned.best.predicted_time, rel=1e-12)
    for base in planned.baselines.values():
        assert planned.best.predicted_time <= base.predicted_time + 1e-9
    for p in (*planned.ranked, *planned.baselines.values(), *exact.ranked):
        check_micro_batches(wf, p.micro_batch,
                            devices={c.component: c.num_devices for c in p.placement})


def test_fixed_mode_search_covers_only_its_mode() -> None:
    wf = Workflow((Component("a"), Component("b"), Component("c")),
                  (Edge("a", "b"), Edge("b", "c")), global_batch=4)
    cost = AnalyticCostModel({n: AnalyticCost(per_item=1.0, replicated=10) for n in "abc"})
    ev = Evaluator(wf, cost, Cluster.uniform(1, 4, MEM, "H100"), max_chunks=2)
    coll = branch_and_bound(ev, keep=3, mode="collocated")
    assert [s.candidate for s in coll.top] == [((0, 4), (0, 4), (0, 4))]
    dis = branch_and_bound(ev, keep=50, mode="disaggregated")
    for s in dis.top:
        ranges = sorted(s.candidate)
        assert all(a[1] <= b[0] for a, b in itertools.pairwise(ranges))
        assert sum(e - b for b, e in ranges) == 4
    # 3 compositions of 4 devices into 3 parts, in 3! orders.
    assert len(dis.top) == 18
    with pytest.raises(PlanningError, match="mode"):
        branch_and_bound(ev, mode="hybrid")


def test_budget_stops_the_search_and_says_so() -> None:
    wf = Workflow((Component("a"), Component("b")), (Edge("a", "b"),), global_batch=8)
    cost = AnalyticCostModel({n: AnalyticCost(per_item=1.0, switch=1.0, replicated=60)
                              for n in "ab"})
    cl = Cluster.uniform(1, 6, MEM, "H100")
    ev = Evaluator(wf, cost, cl, max_chunks=4)
    partial = branch_and_bound(ev, keep=1, max_leaves=1)
    assert not partial.complete and partial.leaves == 1
    assert branch_and_bound(ev, keep=1).complete
    with pytest.raises(PlanningError, match="max_candidates"):
        exhaustive_search(wf, cost, cl, max_chunks=4, max_candidates=1)


def test_candidates_with_one_signature_share_a_simulation() -> None:
    # On one node, the 2+2 pipeline at devices 0-3 and at 2-5 is the same simulation.
    wf = Workflow((Component("a"), Component("b")), (Edge("a", "b", bytes_per_item=1e9),),
                  global_batch=8)
    cost = AnalyticCostModel({n: AnalyticCost(per_item=1.0, replicated=60, switch=1.0)
                              for n in "ab"})
    cl = Cluster.uniform(1, 6, MEM, "H100", intra_node_bandwidth=1e10)
    ev = Evaluator(wf, cost, cl, max_chunks=4)
    left, right = ((0, 2), (2, 4)), ((2, 4), (4, 6))
    assert ev.signature(left) == ev.signature(right)
    assert ev.time(left, (2, 2)) == ev.time(right, (2, 2))
    assert ev.simulations == 1
    direct = simulate(wf, parse_placement("a: 2-3, b: 4-5", components=wf.names, num_devices=6),
                      cost, cl, micro_batch={"a": 2, "b": 2})
    assert direct.iteration_time == ev.time(right, (2, 2))
    # Across a node boundary the transfer is slower: another signature.
    two_nodes = Evaluator(wf, cost, Cluster.uniform(2, 3, MEM, "H100"), max_chunks=4)
    assert two_nodes.signature(((0, 1), (1, 2))) != two_nodes.signature(((2, 3), (3, 4)))
