"""Planner: known answers, fixed-mode guarantees, agreement with exhaustive search."""

from __future__ import annotations

import itertools
import math

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from rlinf.sched.analytic_costs import AnalyticCost, AnalyticCostModel
from rlinf.sched.cluster import Cluster
from rlinf.sched.errors import PlanningError
from rlinf.sched.execution_plan import ExecutionPlan, PlanResult
from rlinf.sched.granularity import check_micro_batches
from rlinf.sched.placement import ExecutionMode, parse_placement
from rlinf.sched.planner import (
    PlannerOptions,
    block_layouts,
    exhaustive_search,
    plan,
)
from rlinf.sched.simulator import simulate
from rlinf.sched.workflow import Component, Edge, Loop, Workflow

MEM = 100


def two_stage(*, replicated: float, switch: float, batch: int = 16) -> tuple[Workflow,
                                                                           AnalyticCostModel]:
    wf = Workflow((Component("a"), Component("b")), (Edge("a", "b"),), global_batch=batch)
    cost = AnalyticCostModel({
        n: AnalyticCost(per_item=1.0, replicated=replicated, switch=switch) for n in ("a", "b")
    })
    return wf, cost


def cluster(devices: int, nodes: int = 1) -> Cluster:
    return Cluster.uniform(nodes, devices // nodes, MEM, "H100")


def test_balanced_stages_with_free_switching_tie() -> None:
    # Collocated: 16/4 + 16/4 = 8 s. Disaggregated 2+2 with 8 micro-batches of 2 items, one
    # per device (1 s each): 1 fill + 7·1 + 1 drain = 9 s — equal up to the pipeline fill
    # (1/8). Micro-batches of 1 item would leave a device of each stage idle.
    wf, cost = two_stage(replicated=10, switch=0)
    result = plan(wf, cost, cluster(4))
    coll, dis = result.baselines["collocated"], result.baselines["disaggregated"]
    assert result.best.predicted_time == pytest.approx(8.0)
    assert coll.predicted_time == pytest.approx(8.0)
    assert dis.predicted_time == pytest.approx(9.0)
    assert dis.micro_batch == {"a": 2, "b": 2}
    assert dis.predicted_time <= coll.predicted_time * (1 + 1 / 8) + 1e-9


def test_costly_switching_makes_spatial_win() -> None:
    # a and b cannot co-reside (60 + 60 > 100): collocated pays two 5 s switches (18 s) while
    # the 2+2 pipeline needs none (9 s).
    wf, cost = two_stage(replicated=60, switch=5)
    result = plan(wf, cost, cluster(4))
    assert result.best.mode is ExecutionMode.DISAGGREGATED
    assert result.best.predicted_time == pytest.approx(9.0)
    assert result.baselines["collocated"].predicted_time == pytest.approx(18.0)
    assert result.best.placement.devices_of("a") == (0, 1)


def test_memory_forbidding_coresidence_switches_when_switching_is_cheap() -> None:
    wf, cost = two_stage(replicated=60, switch=0.1)
    result = plan(wf, cost, cluster(4))
    best = result.best
    assert best.mode is ExecutionMode.COLLOCATED
    assert best.predicted_time == pytest.approx(8.2)
    sim = simulate(wf, best.placement, cost, cluster(4), micro_batch=best.micro_batch)
    assert sim.switch_seconds == pytest.approx(0.2)


def test_component_too_big_for_few_devices_gets_enough() -> None:
    # a shards 300 bytes: it fits only on 3 or more devices of 100 bytes.
    wf = Workflow((Component("a"), Component("b")), (Edge("a", "b"),), global_batch=8)
    cost = AnalyticCostModel({"a": AnalyticCost(per_item=1.0, sharded=300, switch=1),
                              "b": AnalyticCost(per_item=3.0, replicated=5, switch=1)})
    result = plan(wf, cost, cluster(4))
    for p in result.ranked:
        assert len(p.placement.devices_of("a")) >= 3
    with pytest.raises(PlanningError, match="fits"):
        plan(wf, cost, cluster(2))


def cpu_sim_workflow() -> tuple[Workflow, AnalyticCostModel]:
    wf = Workflow(
        (Component("env", resource="cpu"), Component("rollout"), Component("actor")),
        (Edge("env", "rollout"), Edge("rollout", "env", feedback=True),
         Edge("rollout", "actor")),
        global_batch=8, loops=(Loop(("env", "rollout"), 4),))
    cost = AnalyticCostModel({
        "env": AnalyticCost(serial_per_item=0.1),            # CPU bound: more devices don't help
        "rollout": AnalyticCost(per_item=0.4, replicated=60, switch=2),
        "actor": AnalyticCost(per_item=1.0, replicated=60, switch=2),
    })
    return wf, cost


def test_cpu_simulator_next_to_gpu_policy_makes_hybrid_win() -> None:
    # Serial (collocated): 4 steps × (0.8 s env + 0.8 s rollout) plus switches. The winner runs
    # the CPU-bound env beside the policy, pipelined, and time-shares devices with the actor.
    wf, cost = cpu_sim_workflow()
    result = plan(wf, cost, cluster(4), options=PlannerOptions(max_chunks=4))
    best = result.best
    assert best.mode is ExecutionMode.HYBRID
    env, rollout, actor = (set(best.placement.devices_of(n)) for n in ("env", "rollout", "actor"))
    assert env.isdisjoint(rollout)
    assert actor & (env | rollout)
    for kind in ("collocated", "disaggregated"):
        assert best.predicted_time < result.baselines[kind].predicted_time - 0.5


def _fixed_mode_times(wf: Workflow, cost: AnalyticCostModel, cl: Cluster,
                      max_chunks: int) -> list[float]:
    """Independent brute force over collocated and contiguous disaggregated placements on
    every device, with micro-batches the runtime runs (`check_micro_batches`)."""
    n = cl.num_devices
    names = wf.names
    sizes = {c: sorted({math.ceil(wf.batch_of(c) / k) for k in (1, 2, 4, 8, 16)
                        if k <= max_chunks and k <= wf.batch_of(c)}) for c in names}
    specs = [f"{','.join(names)}: 0-{n - 1}"]
    for cuts in itertools.combinations(range(1, n), len(names) - 1):
        bounds = (0, *cuts, n)
        specs.append(", ".join(f"{c}: {bounds[i]}-{bounds[i + 1] - 1}"
                               for i, c in enumerate(names)))
    times = []
    for spec in specs:
        placement = parse_placement(spec, components=names, num_devices=n)
        for combo in itertools.product(*(sizes[c] for c in names)):
            try:
                mb = dict(zip(names, combo, strict=True))
                check_micro_batches(wf, mb, devices={c: len(placement.devices_of(c))
                                                     for c in names})
                r = simulate(wf, placement, cost, cl, micro_batch=mb)
            except PlanningError:
                continue
            times.append(r.iteration_time)
    return times


small_costs = st.builds(
    AnalyticCost,
    fixed=st.sampled_from([0.0, 0.2, 1.0]),
    per_item=st.floats(0.1, 2.0),
    sync=st.sampled_from([0.0, 0.3]),
    replicated=st.sampled_from([10, 40, 60]),
    switch=st.floats(0.0, 3.0),
)


@st.composite
def small_workloads(draw: st.DrawFn) -> tuple[Workflow, AnalyticCostModel, Cluster]:
    ncomp = draw(st.integers(2, 3))
    names = [f"c{i}" for i in range(ncomp)]
    edges = tuple(Edge(a, b, bytes_per_item=draw(st.sampled_from([0.0, 1e9])))
                  for a, b in itertools.pairwise(names))
    streaming = draw(st.booleans())
    comps = [Component(n, resource=draw(st.sampled_from(["gpu", "gpu", "cpu"])),
                       streaming=streaming and i == 0,
                       completion=((0.5, 0.25), (1.0, 1.0)) if streaming and i == 0
                       else ((1.0, 1.0),))
             for i, n in enumerate(names)]
    wf = Workflow(tuple(comps), edges, global_batch=draw(st.sampled_from([4, 8])))
    cost = AnalyticCostModel({n: draw(small_costs) for n in names})
    devices = draw(st.sampled_from([2, 3] if ncomp == 3 else [2, 4, 6]))
    return wf, cost, Cluster.uniform(1, devices, MEM, "H100", intra_node_bandwidth=1e10)


HEURISTIC_SLACK = 1.05
"""How far the large-cluster search (forced on a small cluster) may stay above the optimum.
Over 950 random `small_workloads`-like cases it matched exhaustive search in all but one
(gap 0.11%, a per-component micro-batch mix its uniform-split scoring skips)."""


# Derandomized and without an example database: every run checks the same examples.
@settings(max_examples=20, deadline=None, derandomize=True, database=None,
          suppress_health_check=[HealthCheck.too_slow])
@given(small_workloads())
def test_planner_matches_exhaustive_and_beats_fixed_modes(
    case: tuple[Workflow, AnalyticCostModel, Cluster],
) -> None:
    wf, cost, cl = case
    opts = PlannerOptions(max_chunks=4)
    exact = exhaustive_search(wf, cost, cl, max_chunks=4, prune=False, keep=1)
    planned = plan(wf, cost, cl, options=opts)
    heuristic = plan(wf, cost, cl, options=PlannerOptions(max_chunks=4, exact_limit=0))
    best = exact.best.predicted_time
    assert planned.best.predicted_time == pytest.approx(best, rel=1e-9)
    assert best * (1 - 1e-9) <= heuristic.best.predicted_time <= best * HEURISTIC_SLACK
    fixed = _fixed_mode_times(wf, cost, cl, 4)
    assert planned.best.predicted_time <= min(fixed) + 1e-9
    assert heuristic.best.predicted_time <= min(fixed) + 1e-9


def test_large_cluster_plan_is_never_slower_than_fixed_modes() -> None:
    wf, cost = cpu_sim_workflow()
    result = plan(wf, cost, Cluster.uniform(32, 8, MEM, "H100"))
    assert result.best.predicted_time <= min(p.predicted_time
                                             for p in result.baselines.values()) + 1e-12
    assert set(result.baselines) == {"collocated", "disaggregated"}
    # A batch of 8 items runs on at most 8 devices (one item each): collocated on 0-7.
    collocated = parse_placement("env,rollout,actor: 0-7", components=wf.names,
                                 num_devices=256)
    whole = simulate(wf, collocated, cost, Cluster.uniform(32, 8, MEM, "H100"))
    assert result.best.predicted_time <= whole.iteration_time
    times = [p.predicted_time for p in result.ranked]
    assert times == sorted(times)
    for p in (*result.ranked, *result.baselines.values()):
        check_micro_batches(wf, p.micro_batch, devices={c.component: c.num_devices
                                                        for c in p.placement})


def test_plan_json_round_trip(tmp_path: object) -> None:
    wf, cost = cpu_sim_workflow()
    result = plan(wf, cost, cluster(4), options=PlannerOptions(max_chunks=4))
    path = tmp_path / "plan.json"  # type: ignore[operator]
    result.save(path)
    loaded = PlanResult.load(path)
    assert loaded.ranked == result.ranked
    assert loaded.baselines == result.baselines
    best = loaded.best
    assert best.granularity == {"env->rollout": best.micro_batch["rollout"],
                                "rollout->env": best.micro_batch["env"],
                                "rollout->actor": best.micro_batch["actor"]}
    assert ExecutionPlan.from_dict(best.to_dict()) == best
    with pytest.raises(PlanningError, match="format"):
        PlanResult.from_dict({"best": {}})
    with pytest.raises(PlanningError, match="invalid execution plan"):
        ExecutionPlan.from_dict({"placement": {"mode": "collocated"}})


def test_block_layouts_cover_the_three_modes() -> None:
    shapes = {(lay.ranges, lay.blocks) for lay in block_layouts(2)}
    assert (((0, 1), (0, 1)), 1) in shapes            # collocated
    assert (((0, 1), (1, 2)), 2) in shapes            # disaggregated
    assert (((0, 1), (0, 2)), 2) in shapes            # a on one block, b on both
    assert (((0, 1), (0, 1)), 2) in shapes            # collocated, second block idle
    assert (((0, 2), (1, 3)), 3) in shapes            # partial overlap (interval layouts)
    assert len(block_layouts(3, idle=False, interval_blocks=0)) == 17
    assert len(block_layouts(5, idle=False)) == 322   # labelled layouts only above 3 parts


def _loop_case(seed: int) -> tuple[Workflow, AnalyticCostModel, Cluster]:
    import random

    rng = random.Random(seed)
    names = ("env", "rollout", "actor")
    wf = Workflow(
        (Component("env", resource=rng.choice(["cpu", "gpu"])), Component("rollout"),
         Component("actor")),
        (Edge("env", "rollout", bytes_per_item=rng.choice([0.0, 1e8])),
         Edge("rollout", "env", feedback=True), Edge("rollout", "actor")),
        global_batch=8, loops=(Loop(("env", "rollout"), rng.choice([2, 4])),))
    cost = AnalyticCostModel({n: AnalyticCost(
        fixed=rng.choice([0.0, 0.05]), per_item=rng.uniform(0.05, 1.0),
        serial_per_item=rng.choice([0.0, 0.05]), sync=rng.choice([0.0, 0.2]),
        replicated=rng.choice([20, 40, 60]), switch=rng.uniform(0.0, 3.0)) for n in names})
    return wf, cost, Cluster.uniform(1, rng.choice([4, 5, 6]), MEM, "H100")


@pytest.mark.parametrize("seed", range(6))
def test_heuristic_search_stays_close_to_exhaustive_on_loops(seed: int) -> None:
    # The large-cluster search (forced here on a small one) against exact branch and bound.
    wf, cost, cl = _loop_case(seed)
    exact = exhaustive_search(wf, cost, cl, max_chunks=4, keep=1)
    heuristic = plan(wf, cost, cl, options=PlannerOptions(max_chunks=4, exact_limit=0))
    assert heuristic.best.predicted_time <= exact.best.predicted_time * 1.02
    assert heuristic.best.predicted_time >= exact.best.predicted_time * (1 - 1e-9)


def _chain3(costs: dict[str, AnalyticCost], *, bytes_c1_c2: float = 0.0
            ) -> tuple[Workflow, AnalyticCostModel, Cluster]:
    wf = Workflow((Component("c0"), Component("c1"), Component("c2")),
                  (Edge("c0", "c1"), Edge("c1", "c2", bytes_per_item=bytes_c1_c2)),
                  global_batch=4)
    return wf, AnalyticCostModel(costs), Cluster.uniform(1, 3, MEM, "H100",
                                                         intra_node_bandwidth=1e10)


@pytest.mark.parametrize(("costs", "bytes_c1_c2", "optimum"), [
    # A consumer nested in its producers' devices (c0,c1: 0-2, c2: 0): devices 1-2 go on
    # producing while device 0 consumes, so micro-batches pay although no range is disjoint.
    ({"c0": AnalyticCost(per_item=1.0, replicated=10),
      "c1": AnalyticCost(per_item=1.0, replicated=10),
      "c2": AnalyticCost(per_item=0.125, sync=0.3, replicated=10)}, 1e9, "c0,c1: 0-2, c2: 0"),
    # Found as "the sink with a per-call cost takes the whole batch while its producers
    # stream" (c0: 0-1, c1: 2, c2: 0-2); with at least one item per device c0 can no longer
    # stream single items from two devices, and the sink nested in c0's devices wins.
    ({"c0": AnalyticCost(per_item=1.0, replicated=10, switch=1.0),
      "c1": AnalyticCost(per_item=0.5, replicated=40),
      "c2": AnalyticCost(per_item=1.0, sync=0.3, replicated=60)}, 0.0, "c0,c2: 0-1, c1: 2"),
])
def test_heuristic_search_finds_nested_and_whole_batch_sink_optima(
        costs: dict[str, AnalyticCost], bytes_c1_c2: float, optimum: str) -> None:
    # Counterexamples hypothesis once found to the large-cluster search's uniform scoring.
    wf, cost, cl = _chain3(costs, bytes_c1_c2=bytes_c1_c2)
    exact = exhaustive_search(wf, cost, cl, max_chunks=4, prune=False, keep=1).best
    heuristic = plan(wf, cost, cl, options=PlannerOptions(max_chunks=4, exact_limit=0)).best
    assert exact.spec == optimum
    assert heuristic.predicted_time == pytest.approx(exact.predicted_time, rel=1e-9)


def test_a_device_that_buys_almost_nothing_is_left_out() -> None:
    # Two devices make the call 0.4% faster (1.004 s against 1.008 s): within a 0.5% tie
    # tolerance, so the plan on one device slot ranks first; with none (default), the faster.
    wf = Workflow((Component("a"),), (), global_batch=8)
    cost = AnalyticCostModel({"a": AnalyticCost(fixed=1.0, per_item=0.001)})
    tied = plan(wf, cost, cluster(2), options=PlannerOptions(tie_tolerance=0.005)).best
    assert len(tied.placement.devices_of("a")) == 1
    strict = plan(wf, cost, cluster(2)).best
    assert len(strict.placement.devices_of("a")) == 2
    assert strict.predicted_time < tied.predicted_time <= strict.predicted_time * 1.005
