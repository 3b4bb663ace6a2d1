"""Device orders: on mixed clusters the planner finds non-contiguous device sets."""

from __future__ import annotations

import itertools
from collections.abc import Sequence

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from rlinf.sched.analytic_costs import AnalyticCost, AnalyticCostModel
from rlinf.sched.cluster import Cluster, Device, Node
from rlinf.sched.errors import PlanningError
from rlinf.sched.planner import PlannerOptions, device_orders, exhaustive_search, plan
from rlinf.sched.simulator import simulate
from rlinf.sched.workflow import Component, Edge, Workflow

GB = 10**9


def mixed(*nodes: Sequence[int], intra: float = 4.5e11) -> Cluster:
    """A cluster whose node k has devices of `nodes[k]` GB each, numbered node by node."""
    node_list, devices = [], []
    for k, memories in enumerate(nodes):
        first = len(devices)
        for local, gb in enumerate(memories):
            devices.append(Device(first + local, k, local, f"gpu{gb}", gb * GB))
        node_list.append(Node(k, f"node{k}", tuple(range(first, len(devices)))))
    return Cluster(tuple(node_list), tuple(devices), intra_node_bandwidth=intra)


def test_orders_group_equal_devices_node_by_node_and_across_nodes() -> None:
    assert device_orders(Cluster.uniform(2, 4, "80GB")) == [tuple(range(8))]
    one = mixed([80, 80, 24, 24, 24, 24, 80, 80])
    assert device_orders(one) == [tuple(range(8)), (0, 1, 6, 7, 2, 3, 4, 5)]
    assert device_orders(one, reorder=False) == [tuple(range(8))]
    two = mixed([24, 80], [24, 80])
    assert device_orders(two) == [(0, 1, 2, 3), (1, 0, 3, 2), (1, 3, 0, 2)]


def memory_bound_pipeline() -> tuple[Workflow, AnalyticCostModel]:
    """A light generator feeding a trainer whose 120 GB of sharded state fits in 80 GB
    devices only: two of them (60 GB + 10 GB each) or four (30 + 10), never a 24 GB one."""
    wf = Workflow((Component("rollout"), Component("actor")),
                  (Edge("rollout", "actor", bytes_per_item=1e6),), global_batch=64)
    cost = AnalyticCostModel({
        "rollout": AnalyticCost(fixed=0.5, per_item=1.0, replicated=16 * GB, switch=2.0),
        "actor": AnalyticCost(fixed=0.5, per_item=2.0, sharded=120 * GB, replicated=10 * GB,
                              switch=4.0),
    })
    return wf, cost


def test_memory_hungry_component_gets_the_large_devices_at_both_ends() -> None:
    # 80, 80, 24, 24, 24, 24, 80, 80 GB. Contiguous ranges give the trainer two 80 GB devices
    # (64 × 2 s / 2 on the bottleneck: 69.2 s); the four 80 GB devices 0-1,6-7 halve it
    # while the generator streams from the four 24 GB ones (38.5 s).
    wf, cost = memory_bound_pipeline()
    cl = mixed([80, 80, 24, 24, 24, 24, 80, 80])
    contiguous = plan(wf, cost, cl, options=PlannerOptions(reorder_devices=False))
    assert contiguous.best.predicted_time == pytest.approx(69.1667, rel=1e-4)
    result = plan(wf, cost, cl)
    best = result.best
    assert best.spec == "rollout: 2-5, actor: 0-1,6-7"
    assert best.placement.devices_of("actor") == (0, 1, 6, 7)
    assert best.predicted_time == pytest.approx(38.5)
    assert result.baselines["disaggregated"].spec == best.spec
    # The simulator prices the non-contiguous placement the same as the planner did.
    sim = simulate(wf, best.placement, cost, cl, micro_batch=best.micro_batch)
    assert sim.iteration_time == pytest.approx(best.predicted_time, rel=1e-12)
    # The large-cluster search alone finds it too; exhaustive search is the reference.
    alone = plan(wf, cost, cl, options=PlannerOptions(exact_limit=0))
    assert alone.best.predicted_time == pytest.approx(38.5)
    reference = exhaustive_search(wf, cost, cl, keep=1)
    assert reference.best.predicted_time == pytest.approx(best.predicted_time, rel=1e-9)
    old_space = exhaustive_search(wf, cost, cl, keep=1, reorder_devices=False)
    assert old_space.best.predicted_time == pytest.approx(
        contiguous.best.predicted_time, rel=1e-9)


def test_large_devices_spread_over_two_nodes_are_gathered() -> None:
    wf, cost = memory_bound_pipeline()
    cl = mixed([80, 24, 80, 24], [24, 80, 24, 80])
    result = plan(wf, cost, cl)
    reference = exhaustive_search(wf, cost, cl, keep=1)
    assert result.best.predicted_time == pytest.approx(reference.best.predicted_time, rel=1e-9)
    assert result.best.placement.devices_of("actor") == (0, 2, 5, 7)


@st.composite
def mixed_workloads(draw: st.DrawFn) -> tuple[Workflow, AnalyticCostModel, Cluster]:
    """Two or three stages, some of which fit only the large devices, on 3–6 devices of
    100 or 40 GB in random order, one node or two."""
    names = ["a", "b", "c"][: draw(st.integers(2, 3))]
    wf = Workflow(tuple(Component(n, resource=draw(st.sampled_from(["gpu", "gpu", "cpu"])))
                        for n in names),
                  tuple(Edge(s, d, bytes_per_item=draw(st.sampled_from([0.0, 1e9])))
                        for s, d in itertools.pairwise(names)),
                  global_batch=draw(st.sampled_from([4, 8])))
    cost = AnalyticCostModel({n: AnalyticCost(
        fixed=draw(st.sampled_from([0.0, 0.2])), per_item=draw(st.floats(0.1, 2.0)),
        sync=draw(st.sampled_from([0.0, 0.3])),
        replicated=draw(st.sampled_from([10, 30, 60])) * GB,
        switch=draw(st.floats(0.0, 3.0))) for n in names})
    count = draw(st.integers(3, 6 if len(names) == 2 else 4))
    memories = draw(st.lists(st.sampled_from([100, 40]), min_size=count, max_size=count))
    split = draw(st.sampled_from([count, count // 2])) if count >= 4 else count
    nodes = [memories[:split], memories[split:]] if split < count else [memories]
    return wf, cost, mixed(*nodes, intra=1e10)


@settings(max_examples=12, deadline=None, derandomize=True, database=None,
          suppress_health_check=[HealthCheck.too_slow])
@given(mixed_workloads())
def test_planner_finds_the_optimum_over_every_order(
        case: tuple[Workflow, AnalyticCostModel, Cluster]) -> None:
    wf, cost, cl = case
    try:
        full = exhaustive_search(wf, cost, cl, max_chunks=4, keep=2, prune=False)
    except PlanningError:
        with pytest.raises(PlanningError):
            plan(wf, cost, cl, options=PlannerOptions(max_chunks=4))
        return
    pruned = exhaustive_search(wf, cost, cl, max_chunks=4, keep=2)
    assert [p.predicted_time for p in pruned.ranked] == pytest.approx(
        [p.predicted_time for p in full.ranked], rel=1e-9)
    planned = plan(wf, cost, cl, options=PlannerOptions(max_chunks=4))
    assert planned.best.predicted_time == pytest.approx(full.best.predicted_time, rel=1e-9)
    contiguous = exhaustive_search(wf, cost, cl, max_chunks=4, keep=1, reorder_devices=False)
    assert planned.best.predicted_time <= contiguous.best.predicted_time * (1 + 1e-9)
