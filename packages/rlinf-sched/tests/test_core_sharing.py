"""Components on CPU slots sharing their node's cores: cases computed by hand, and the
event-driven schedule agreeing with the fixed-duration one whenever nothing contends."""

from __future__ import annotations

import dataclasses
import itertools

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from rlinf.sched.analytic_costs import AnalyticCost, AnalyticCostModel
from rlinf.sched.cluster import Cluster
from rlinf.sched.core_sharing import CoreSharing
from rlinf.sched.placement import parse_placement
from rlinf.sched.simulator import SimulationResult, simulate
from rlinf.sched.workflow import Component, Edge, Workflow


def cpu_box(slots: int, cores: int, background: float = 0.0) -> Cluster:
    return dataclasses.replace(Cluster.uniform(1, slots, 10**9, "cpu", cpus_per_node=cores),
                               cpu_background=background)


def run(wf: Workflow, spec: str, cost: AnalyticCostModel, cluster: Cluster,
        micro_batch: dict[str, int] | None = None) -> SimulationResult:
    placement = parse_placement(spec, components=wf.names, num_devices=cluster.num_devices)
    return simulate(wf, placement, cost, cluster, micro_batch=micro_batch, record=True)


PAIR = Workflow((Component("a"), Component("b")), (), global_batch=4)
HALF_EACH = AnalyticCostModel({"a": AnalyticCost(per_item=0.5), "b": AnalyticCost(per_item=0.5)})


def test_two_slots_on_one_core_take_twice_as_long_side_by_side() -> None:
    # a and b take 2 s alone; on one core each runs at half speed: both end at 4 s.
    r = run(PAIR, "a: 0, b: 1", HALF_EACH, cpu_box(2, 1))
    assert r.iteration_time == pytest.approx(4.0)
    assert r.busy_seconds == {"a": pytest.approx(4.0), "b": pytest.approx(4.0)}
    # with a core each and nothing in the background, nothing contends
    assert run(PAIR, "a: 0, b: 1", HALF_EACH, cpu_box(2, 2)).iteration_time == pytest.approx(2.0)


def test_the_background_slows_components_side_by_side_but_not_one_alone() -> None:
    # 2 cores, background 0.5: alone min(1, 2/1.5) = 1; together 2/2.5 = 0.8 → 2 / 0.8 = 2.5 s
    box = cpu_box(2, 2, background=0.5)
    assert run(PAIR, "a: 0, b: 1", HALF_EACH, box).iteration_time == pytest.approx(2.5)
    assert run(PAIR, "a,b: 0-1", HALF_EACH, box).iteration_time == pytest.approx(1.0 + 1.0)


def test_a_component_on_more_slots_than_cores_computes_as_on_as_many_slots_as_cores() -> None:
    # 4 slots of 2 cores compute what 2 slots do: the curve is read at 2 devices (its own
    # threads share the cores already there, so no further slowdown), not extrapolated to 4.
    cost = AnalyticCostModel({"a": AnalyticCost(per_item=1.0), "b": AnalyticCost(per_item=1.0)})
    on_four = run(PAIR, "a,b: 0-3", cost, cpu_box(4, 2))
    assert on_four.iteration_time == pytest.approx(2 * (4 * 1.0 / 2))
    on_two = run(PAIR, "a,b: 0-1", cost, cpu_box(4, 2))
    assert on_four.iteration_time == pytest.approx(on_two.iteration_time)
    sharing = CoreSharing.of(cpu_box(4, 2))
    assert sharing is not None
    assert [sharing.parallel_devices(range(n), cpu_box(4, 2)) for n in (1, 2, 3, 4)] == [1, 2,
                                                                                       2, 2]


def test_a_stream_slows_while_its_consumer_computes_beside_it() -> None:
    # r streams 8 s of work, half its items done at 25%; t takes 1 s per half; one core.
    # 0-2 s r alone reaches 25%; 2-4 s both at half speed: t's first half ends at 4 s, r has
    # done 3 s; r alone finishes its 5 s left at 9 s; t's second half runs 9-10 s.
    wf = Workflow((Component("r", streaming=True, completion=((0.5, 0.25), (1.0, 1.0))),
                   Component("t")), (Edge("r", "t"),), global_batch=8)
    cost = AnalyticCostModel({"r": AnalyticCost(per_item=1.0), "t": AnalyticCost(per_item=0.25)})
    r = run(wf, "r: 0, t: 1", cost, cpu_box(2, 1), {"t": 4})
    assert [(i.start, i.end) for i in r.device_intervals(1)] == [
        pytest.approx((2.0, 4.0)), pytest.approx((9.0, 10.0))]
    assert r.iteration_time == pytest.approx(10.0)


def test_gpu_nodes_and_unknown_core_counts_never_share() -> None:
    assert CoreSharing.of(Cluster.uniform(1, 4, 10**9, "H100", cpus_per_node=1)) is None
    assert CoreSharing.of(cpu_box(4, 0, background=1.0)) is None
    assert CoreSharing.of(cpu_box(2, 2)) is None
    sharing = CoreSharing.of(cpu_box(4, 2))
    assert sharing is not None and sharing.cores == {0: 2}
    assert sharing.rate({0: 1}, {0: 4}) == pytest.approx(0.5)
    assert sharing.rate({0: 4}, {0: 4}) == 1.0


def test_the_background_round_trips_through_the_cluster_file() -> None:
    box = cpu_box(2, 2, background=0.75)
    assert Cluster.from_dict(box.to_dict()).cpu_background == 0.75
    with pytest.raises(Exception, match="cpu_background"):
        Cluster.from_dict({**box.to_dict(), "cpu_background": -1})
    hops = dataclasses.replace(box, message_latency=0.002)
    assert Cluster.from_dict(hops.to_dict()).message_latency == 0.002


@st.composite
def chains(draw: st.DrawFn
           ) -> tuple[Workflow, AnalyticCostModel, str, dict[str, int], int, float]:
    """Chains of 2–4 components (maybe a streaming head), random costs, micro-batches, a
    placement on 2–4 slots and a turn latency."""
    n = draw(st.integers(2, 4))
    names = [f"c{i}" for i in range(n)]
    streaming = draw(st.booleans())
    comps = tuple(Component(name, streaming=streaming and i == 0,
                            completion=((0.5, 0.25), (1.0, 1.0)) if streaming and i == 0
                            else ((1.0, 1.0),))
                  for i, name in enumerate(names))
    edges = tuple(Edge(a, b, bytes_per_item=draw(st.sampled_from([0.0, 1e9])))
                  for a, b in itertools.pairwise(names))
    batch = draw(st.sampled_from([4, 8]))
    wf = Workflow(comps, edges, global_batch=batch)
    cost = AnalyticCostModel({name: AnalyticCost(
        fixed=draw(st.sampled_from([0.0, 0.1])), per_item=draw(st.sampled_from([0.1, 0.5, 1.0])))
        for name in names})
    slots = draw(st.integers(2, 4))
    spec = ", ".join(f"{name}: {draw(st.integers(0, slots - 1))}" for name in names)
    micro = {name: draw(st.sampled_from([1, 2, batch])) for name in names}
    turn = draw(st.sampled_from([0.0, 0.05]))
    return wf, cost, spec, micro, slots, turn


@settings(max_examples=150, deadline=None)
@given(chains())
def test_without_contention_the_event_schedule_equals_the_fixed_one(
    case: tuple[Workflow, AnalyticCostModel, str, dict[str, int], int, float]
) -> None:
    wf, cost, spec, micro, slots, turn = case
    # cores unknown; and a core per slot, every rate 1; both with the same hand-over delay
    unknown = dataclasses.replace(Cluster.uniform(1, slots, 10**9, "cpu"), turn_latency=turn)
    plenty = dataclasses.replace(cpu_box(slots, 10**6, background=1e-9), turn_latency=turn)
    fixed, shared = run(wf, spec, cost, unknown), run(wf, spec, cost, plenty)
    fixed_mb, shared_mb = run(wf, spec, cost, unknown, micro), run(wf, spec, cost, plenty, micro)
    for a, b in ((fixed, shared), (fixed_mb, shared_mb)):
        assert b.iteration_time == pytest.approx(a.iteration_time, rel=1e-6)
        assert b.busy_seconds == pytest.approx(dict(a.busy_seconds), rel=1e-6)
        assert sorted((i.component, i.step, i.chunk, round(i.start, 6)) for i in b.intervals) \
            == sorted((i.component, i.step, i.chunk, round(i.start, 6)) for i in a.intervals)

