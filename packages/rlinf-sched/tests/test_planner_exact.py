"""Exact search: branch and bound equals brute force; the planner finds the step-1 optimum."""

from __future__ import annotations

import dataclasses
import itertools
import math
import random

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
    exhaustive_candidates,
    exhaustive_search,
    plan,
)
from rlinf.sched.planner.progress import PlanProgress
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


@st.composite
def shared_core_workloads(draw: st.DrawFn) -> tuple[Workflow, AnalyticCostModel, Cluster]:
    """`workloads` on CPU slots that share their node's cores (fewer cores than slots, or a
    background), where the search's bound counts each node's cores."""
    wf, cost, cl = draw(workloads())
    per_node = cl.num_devices // len(cl.nodes)
    box = Cluster.uniform(len(cl.nodes), per_node, MEM, "cpu",
                          cpus_per_node=draw(st.integers(1, per_node)),
                          intra_node_bandwidth=1e10, inter_node_bandwidth=1e9)
    return wf, cost, dataclasses.replace(
        box, cpu_background=draw(st.sampled_from([0.0, 0.5])),
        turn_latency=draw(st.sampled_from([0.0, 0.05])))


@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.one_of(workloads(), shared_core_workloads()))
def test_pruned_exhaustive_equals_unpruned(
    case: tuple[Workflow, AnalyticCostModel, Cluster],
) -> None:
    wf, cost, cl = case
    full = _times(wf, cost, cl, prune=False, keep=3)
    pruned = _times(wf, cost, cl, prune=True, keep=3)
    assert pruned == pytest.approx(full, rel=1e-9)


@settings(max_examples=20, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(shared_core_workloads(), st.integers(0, 2**16))
def test_bounds_never_exceed_a_simulation_on_shared_cores(
    case: tuple[Workflow, AnalyticCostModel, Cluster], seed: int,
) -> None:
    wf, cost, cl = case
    ev = Evaluator(wf, cost, cl, max_chunks=4)
    try:
        candidates = exhaustive_candidates(ev)
    except PlanningError:
        return
    pick = random.Random(seed)
    for cand in pick.sample(candidates, min(20, len(candidates))):
        for sizes in itertools.islice(itertools.product(*ev.options(cand)), 6):
            t = ev.time(cand, sizes)
            assert ev.sized_bound(cand, sizes) <= t
            assert ev.lower_bound(cand) <= t


def test_shared_cores_bound_the_iteration_by_their_total_work() -> None:
    # Two components of 1 s each, alone on a slot apiece of a 1-core box: the core does 2 s
    # of work whatever the placement, though no slot holds more than 1 s of it.
    wf = Workflow((Component("a"), Component("b")), (), global_batch=1)
    cost = AnalyticCostModel({n: AnalyticCost(per_item=1.0) for n in "ab"})
    ev = Evaluator(wf, cost, Cluster.uniform(1, 2, MEM, "cpu", cpus_per_node=1), max_chunks=1)
    apart = ((0, 1), (1, 2))
    assert ev.core_shares(0, 1) == ((0, 1.0),)
    assert ev.lower_bound(apart) == pytest.approx(2.0, rel=1e-5)
    assert ev.time(apart, (1, 1)) == pytest.approx(2.0)
    # With a core per slot nothing is shared: the bound is the busiest slot.
    roomy = Evaluator(wf, cost, Cluster.uniform(1, 2, MEM, "cpu", cpus_per_node=2),
                      max_chunks=1)
    assert roomy.core_shares(0, 1) == ()
    assert roomy.lower_bound(apart) == pytest.approx(1.0)


def test_translations_of_a_leaf_reuse_its_micro_batch_search() -> None:
    wf = Workflow((Component("a"), Component("b")), (Edge("a", "b", bytes_per_item=1e9),),
                  global_batch=8)
    cost = AnalyticCostModel({n: AnalyticCost(per_item=1.0, replicated=60, switch=1.0)
                              for n in "ab"})
    ev = Evaluator(wf, cost, Cluster.uniform(1, 6, MEM, "H100"), max_chunks=4)
    left = ev.best(((0, 2), (2, 4)), exhaustive=True)
    runs = ev.simulations
    right = ev.best(((2, 4), (4, 6)), exhaustive=True)
    assert left is not None and right is not None
    assert ev.simulations == runs
    assert (right.time, dict(right.micro_batch)) == (left.time, dict(left.micro_batch))
    assert right.candidate == ((2, 4), (4, 6))
    # A search under a lower threshold answers from it too; a higher one searches again.
    assert ev.best(((1, 3), (3, 5)), exhaustive=True, below=left.time / 2) is not None
    assert ev.simulations == runs


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


def test_a_budget_stops_the_search_and_says_so() -> None:
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
    # A spent deadline stops it before any leaf; the planner keeps its search's plans.
    stopped = branch_and_bound(ev, keep=1, deadline=0.0)
    assert not stopped.complete and stopped.leaves == 0 and stopped.top == []
    full = plan(wf, cost, cl, options=PlannerOptions(max_chunks=4))
    quick = plan(wf, cost, cl, options=PlannerOptions(max_chunks=4, exact_seconds=0.0))
    search_only = plan(wf, cost, cl, options=PlannerOptions(max_chunks=4, exact_limit=0))
    assert quick.best.predicted_time == search_only.best.predicted_time
    assert quick.best.predicted_time >= full.best.predicted_time
    assert set(quick.baselines) == set(full.baselines)


def test_a_search_out_of_time_still_ranks_its_best_seed_and_both_fixed_modes() -> None:
    wf = Workflow((Component("a"), Component("b"), Component("c")),
                  (Edge("a", "b"), Edge("b", "c")), global_batch=8)
    cost = AnalyticCostModel({n: AnalyticCost(per_item=1.0, switch=0.5, replicated=30)
                              for n in "abc"})
    cl = Cluster.uniform(1, 8, MEM, "H100")
    full = plan(wf, cost, cl, options=PlannerOptions(max_chunks=4))
    cut = plan(wf, cost, cl, options=PlannerOptions(max_chunks=4, search_seconds=0.0))
    assert cut.evaluated < full.evaluated
    assert set(cut.baselines) == set(full.baselines) == {"collocated", "disaggregated"}
    assert cut.best.predicted_time >= full.best.predicted_time
    # What it ranks are plans the simulator prices as it says (nothing left unpriced).
    for p in cut.ranked:
        assert math.isfinite(p.predicted_time) and p.predicted_time > 0
    assert cut.best.predicted_time <= min(b.predicted_time for b in cut.baselines.values())
    roomy = plan(wf, cost, cl, options=PlannerOptions(max_chunks=4, search_seconds=600.0))
    assert roomy.best.predicted_time == full.best.predicted_time
    assert roomy.evaluated == full.evaluated


def test_progress_is_reported_during_a_long_search() -> None:
    wf = Workflow((Component("a"), Component("b"), Component("c")),
                  (Edge("a", "b"), Edge("b", "c")), global_batch=8)
    cost = AnalyticCostModel({n: AnalyticCost(per_item=1.0, switch=0.5, replicated=30)
                              for n in "abc"})
    seen: list[PlanProgress] = []
    result = plan(wf, cost, Cluster.uniform(1, 4, MEM, "H100"),
                  options=PlannerOptions(max_chunks=4, progress_every=0.0), progress=seen.append)
    assert [p.simulations for p in seen] == list(range(1, result.evaluated + 1))
    assert {p.phase for p in seen} == {"search", "exact"}
    assert seen[-1].best == pytest.approx(result.best.predicted_time)
    assert all(a.best >= b.best for a, b in itertools.pairwise(seen))


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


@pytest.mark.parametrize("bad", [{"keep": 0}, {"max_chunks": 0}, {"exact_limit": -1},
                                 {"min_step": 0}, {"exact_seconds": -1.0},
                                 {"exact_seconds": float("nan")}, {"search_seconds": -1.0},
                                 {"progress_every": -0.5},
                                 {"tie_tolerance": -0.1}])
def test_options_out_of_range_are_refused_naming_the_field(bad: dict[str, float]) -> None:
    (name, _), = bad.items()
    with pytest.raises(PlanningError, match=f"PlannerOptions.{name}="):
        PlannerOptions(**bad)  # type: ignore[arg-type]
    assert PlannerOptions(exact_seconds=0.0, exact_limit=0, progress_every=0.0).exact_limit == 0
