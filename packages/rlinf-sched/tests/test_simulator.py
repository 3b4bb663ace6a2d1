"""Discrete-event simulator on cases computed by hand."""

from __future__ import annotations

import dataclasses
import itertools

import pytest

from rlinf.sched.analytic_costs import AnalyticCost, AnalyticCostModel
from rlinf.sched.cluster import Cluster
from rlinf.sched.errors import ClusterError, PlanningError
from rlinf.sched.placement import parse_placement
from rlinf.sched.simulator import SimulationResult, simulate
from rlinf.sched.workflow import Component, Edge, Loop, Workflow

GB = 10**9


def chain(*names: str, batch: int = 8, bytes_per_item: float = 0.0, **comp: object) -> Workflow:
    comps = tuple(Component(n, **comp) for n in names)  # type: ignore[arg-type]
    edges = tuple(Edge(a, b, bytes_per_item=bytes_per_item) for a, b in itertools.pairwise(names))
    return Workflow(comps, edges, global_batch=batch)


def run(wf: Workflow, spec: str, cost: AnalyticCostModel, cluster: Cluster,
        micro_batch: dict[str, int] | None = None) -> SimulationResult:
    placement = parse_placement(spec, components=wf.names, num_devices=cluster.num_devices)
    return simulate(wf, placement, cost, cluster, micro_batch=micro_batch, record=True)


def test_collocated_runs_serially_and_pays_each_switch() -> None:
    # a: 1 s/item/device, b: 2 s/item/device, 8 items on 2 devices → 4 s + 8 s; each needs
    # 60 of 100 bytes so they cannot co-reside: a switches in (0.5 s), b switches in (0.25 s).
    wf = chain("a", "b")
    cost = AnalyticCostModel({"a": AnalyticCost(per_item=1.0, replicated=60, switch=0.5),
                              "b": AnalyticCost(per_item=2.0, replicated=60, switch=0.25)})
    cluster = Cluster.uniform(1, 2, 100, "H100")
    r = run(wf, "a,b: 0-1", cost, cluster)
    assert r.iteration_time == pytest.approx(0.5 + 4 + 0.25 + 8)
    assert r.switch_seconds == pytest.approx(0.75)
    assert r.busy_seconds == {"a": pytest.approx(4.0), "b": pytest.approx(8.0)}
    assert r.utilisation == pytest.approx(12 / 12.75)
    kinds = [(i.component, i.kind, i.start, i.end) for i in r.device_intervals(0)]
    assert kinds == [("a", "switch", 0, 0.5), ("a", "compute", 0.5, 4.5),
                     ("b", "switch", 4.5, 4.75), ("b", "compute", 4.75, 12.75)]


def test_components_that_fit_together_do_not_switch() -> None:
    wf = chain("a", "b")
    cost = AnalyticCostModel({"a": AnalyticCost(per_item=1.0, replicated=40, switch=5),
                              "b": AnalyticCost(per_item=2.0, replicated=40, switch=5)})
    r = run(wf, "a,b: 0-1", cost, Cluster.uniform(1, 2, 100, "H100"))
    assert r.iteration_time == pytest.approx(12.0)
    assert r.switch_seconds == 0


@pytest.mark.parametrize("chunks", [1, 2, 4, 8])
def test_two_stage_pipeline_is_fill_plus_bottleneck_plus_drain(chunks: int) -> None:
    # a on device 0 (1 s/item), b on device 1 (3 s/item): k micro-batches of 8/k items.
    wf = chain("a", "b")
    cost = AnalyticCostModel({"a": AnalyticCost(per_item=1.0), "b": AnalyticCost(per_item=3.0)})
    size = 8 // chunks
    r = run(wf, "a: 0, b: 1", cost, Cluster.uniform(1, 2, 100, "H100"),
            {"a": size, "b": size})
    fill, bottleneck, drain = 1.0 * size, 3.0 * size, 3.0 * size
    assert r.iteration_time == pytest.approx(fill + (chunks - 1) * bottleneck + drain)
    assert r.utilisation == pytest.approx((8 + 24) / (2 * r.iteration_time))


def test_a_lagged_consumer_runs_beside_its_producer_where_devices_allow() -> None:
    """A lagged edge (the trainer one iteration behind): its data is there at the start, so
    on devices of its own the consumer overlaps the producer (max, not sum) and no transfer
    is charged; on shared devices they still take turns."""
    cost = AnalyticCostModel({"gen": AnalyticCost(per_item=1.0),
                              "train": AnalyticCost(per_item=2.0)})
    cluster = Cluster.uniform(1, 2, 100, "H100", intra_node_bandwidth=10 * GB)
    lagged = Workflow((Component("gen"), Component("train")),
                      (Edge("gen", "train", bytes_per_item=GB, lagged=True),), global_batch=4)
    synchronous = chain("gen", "train", batch=4, bytes_per_item=GB)
    assert run(synchronous, "gen: 0, train: 1", cost, cluster).iteration_time == pytest.approx(
        4 + 0.4 + 8)
    apart = run(lagged, "gen: 0, train: 1", cost, cluster)
    assert apart.iteration_time == pytest.approx(8)
    starts = {i.component: i.start for d in (0, 1) for i in apart.device_intervals(d)}
    assert starts == {"gen": 0.0, "train": 0.0}
    assert run(lagged, "gen,train: 0", cost,
               Cluster.uniform(1, 1, 100, "H100")).iteration_time == pytest.approx(4 + 8)


def test_transfer_cost_intra_and_inter_node() -> None:
    # 4 items × 1 GB over one link: 0.4 s at 10 GB/s within a node, 4 s at 1 GB/s across nodes.
    wf = chain("a", "b", batch=4, bytes_per_item=GB)
    cost = AnalyticCostModel({"a": AnalyticCost(per_item=1.0), "b": AnalyticCost(per_item=1.0)})
    intra = Cluster.uniform(1, 2, 100, "H100", intra_node_bandwidth=10 * GB)
    assert run(wf, "a: 0, b: 1", cost, intra).iteration_time == pytest.approx(4 + 0.4 + 4)
    inter = Cluster.uniform(2, 1, 100, "H100", inter_node_bandwidth=GB)
    assert run(wf, "a: 0, b: 1", cost, inter).iteration_time == pytest.approx(4 + 4 + 4)
    # same devices: data stays put
    assert run(wf, "a,b: 0-1", cost, intra).iteration_time == pytest.approx(2 + 2)


def test_every_message_between_devices_pays_the_link_latency() -> None:
    # 4 items in messages of 1: each of b's calls waits for a's item plus 0.5 s of latency;
    # pipelined, only the last message's latency is exposed (a ends at 4 s, b runs 4.5-5.5).
    wf = chain("a", "b", batch=4, bytes_per_item=1)
    cost = AnalyticCostModel({"a": AnalyticCost(per_item=1.0), "b": AnalyticCost(per_item=1.0)})
    slow = dataclasses.replace(Cluster.uniform(1, 2, 100, "H100"), intra_node_latency=0.5)
    micro = {"a": 1, "b": 1}
    assert run(wf, "a: 0, b: 1", cost, slow, micro).iteration_time == pytest.approx(5.5)
    # a loop pays it twice per step and stage group (there and back): 2 steps x 2 x 0.25 s
    loop = Workflow((Component("env"), Component("rollout")),
                    (Edge("env", "rollout", bytes_per_item=1),
                     Edge("rollout", "env", bytes_per_item=1, feedback=True)),
                    global_batch=1, loops=(Loop(("env", "rollout"), 2),))
    fast = AnalyticCostModel({"env": AnalyticCost(per_item=0.1),
                              "rollout": AnalyticCost(per_item=0.1)})
    apart = dataclasses.replace(slow, intra_node_latency=0.25)
    free = run(loop, "env: 0, rollout: 1", fast, Cluster.uniform(1, 2, 100, "H100"))
    assert run(loop, "env: 0, rollout: 1", fast, apart).iteration_time == pytest.approx(
        free.iteration_time + 3 * 0.25)  # the first step's env input comes from no message
    # the same device set moves nothing, so no latency
    together = run(wf, "a,b: 0-1", cost, Cluster.uniform(1, 2, 100, "H100"), micro)
    assert run(wf, "a,b: 0-1", cost, slow, micro).iteration_time == together.iteration_time
    across = dataclasses.replace(Cluster.uniform(2, 1, 100, "H100"), inter_node_latency=2.0)
    assert across.latency(0, 1) == 2.0 and across.latency(0, 0) == 0.0


def test_each_hand_over_of_a_device_costs_the_turn_latency() -> None:
    # a: 1 s/item/device, b: 2 s/item/device, 8 items in calls of 4; isolated, so each
    # runs in processes of its own and every turn crosses processes.
    wf = chain("a", "b", isolated=True)
    cost = AnalyticCostModel({"a": AnalyticCost(per_item=1.0), "b": AnalyticCost(per_item=2.0)})
    plain = Cluster.uniform(1, 2, 100, "H100")
    turns = dataclasses.replace(plain, turn_latency=0.1)
    micro = {"a": 4, "b": 4}
    # Collocated: a takes the devices (0.1), keeps them for its second call (a's next call
    # starts before b's, which would wait for the hand-over), then b takes them (0.1) and
    # keeps them: 2 + 2 + 4 + 4 s of compute and two hand-overs.
    assert run(wf, "a,b: 0-1", cost, plain, micro).iteration_time == pytest.approx(12.0)
    r = run(wf, "a,b: 0-1", cost, turns, micro)
    assert r.iteration_time == pytest.approx(12.2)
    assert [(i.component, i.start) for i in r.device_intervals(0)] == [
        ("a", pytest.approx(0.1)), ("a", pytest.approx(2.1)), ("b", pytest.approx(4.2)),
        ("b", pytest.approx(8.2))]
    # Apart, neither takes turns: alone on its device a component gets no lock, so no
    # hand-over is priced (a0 0-4, b0 4-12, b1 12-20).
    assert run(wf, "a: 0, b: 1", cost, plain, micro).iteration_time == pytest.approx(20.0)
    assert run(wf, "a: 0, b: 1", cost, turns, micro).iteration_time == pytest.approx(20.0)
    # Nested (hybrid): a alone on device 0 takes no turn; b's calls on device 1 share it
    # with c's and pay the hand-over each time the holder changes.
    wf3 = chain("a", "b", "c", isolated=True)
    cost3 = AnalyticCostModel({n: AnalyticCost(per_item=1.0) for n in "abc"})
    micro3 = {"a": 8, "b": 8, "c": 8}
    base = run(wf3, "a: 0, b,c: 1", cost3, plain, micro3).iteration_time
    assert run(wf3, "a: 0, b,c: 1", cost3, turns, micro3).iteration_time == pytest.approx(
        base + 0.2)


def test_messages_between_components_of_one_process_are_free() -> None:
    # a and b on one device, not isolated: the runtime runs them in one process, and a's
    # message reaches b without a hop (rlinf.sched.process_sets). They still take turns.
    wf = chain("a", "b", bytes_per_item=1.0)
    cost = AnalyticCostModel({"a": AnalyticCost(per_item=1.0), "b": AnalyticCost(per_item=2.0)})
    whole = {"a": 8, "b": 8}
    hops = dataclasses.replace(Cluster.uniform(1, 1, 100, "H100"), turn_latency=0.1,
                               message_latency=0.5)
    # a's turn 0.1, a 0.1-8.1; b's turn 0.1, b 8.2-24.2
    assert run(wf, "a,b: 0", cost, hops, whole).iteration_time == pytest.approx(24.2)
    # isolated, the message pays its hop: b's input at 8.6, its turn, b 8.7-24.7
    apart = chain("a", "b", bytes_per_item=1.0, isolated=True)
    assert run(apart, "a,b: 0", cost, hops, whole).iteration_time == pytest.approx(24.7)
    # Several ranks each: a producer's items also reach the other processes' consumer ranks,
    # so the hop applies (a 0-4, b 4.5-12.5 against 4-12).
    two = Cluster.uniform(1, 2, 100, "H100")
    latency = dataclasses.replace(two, message_latency=0.5)
    assert run(wf, "a,b: 0-1", cost, two, whole).iteration_time == pytest.approx(12.0)
    assert run(wf, "a,b: 0-1", cost, latency, whole).iteration_time == pytest.approx(12.5)


def test_the_turn_latency_round_trips_through_the_cluster_file() -> None:
    turns = dataclasses.replace(Cluster.uniform(1, 2, 100, "H100"), turn_latency=0.012)
    assert Cluster.from_dict(turns.to_dict()).turn_latency == 0.012
    assert "turn_latency" not in Cluster.uniform(1, 2, 100, "H100").to_dict()
    with pytest.raises(ClusterError, match="turn_latency"):
        Cluster.from_dict({**turns.to_dict(), "turn_latency": -1})


def test_streaming_producer_releases_items_as_they_complete() -> None:
    # The rollout call lasts 8 s; half its items are done at 25% (2 s). The consumer's first
    # half starts at 2 s and takes 1 s; its second half waits for the end (8 s).
    wf = Workflow((Component("r", streaming=True, completion=((0.5, 0.25), (1.0, 1.0))),
                   Component("t")), (Edge("r", "t"),), global_batch=8)
    cost = AnalyticCostModel({"r": AnalyticCost(per_item=1.0), "t": AnalyticCost(per_item=0.25)})
    r = run(wf, "r: 0, t: 1", cost, Cluster.uniform(1, 2, 100, "H100"), {"t": 4})
    starts = [(i.start, i.end) for i in r.device_intervals(1)]
    assert starts == [(2.0, 3.0), (8.0, 9.0)]
    assert r.iteration_time == pytest.approx(9.0)


def test_loop_pipelines_micro_batches_across_steps() -> None:
    # env and rollout each take 1 s per item, 2 items, 3 steps. Serial: 4 s per step. With two
    # micro-batches on separate devices, each step adds 2 s after a 1 s fill: 1 + 2·3.
    wf = Workflow((Component("env"), Component("rollout")),
                  (Edge("env", "rollout"), Edge("rollout", "env", feedback=True)),
                  global_batch=2, loops=(Loop(("env", "rollout"), 3),))
    cost = AnalyticCostModel({"env": AnalyticCost(per_item=1.0),
                              "rollout": AnalyticCost(per_item=1.0)})
    cluster = Cluster.uniform(1, 2, 100, "H100")
    assert run(wf, "env: 0, rollout: 1", cost, cluster).iteration_time == pytest.approx(12)
    piped = run(wf, "env: 0, rollout: 1", cost, cluster, {"env": 1, "rollout": 1})
    assert piped.iteration_time == pytest.approx(7)


def test_cpu_components_never_switch_but_still_take_turns() -> None:
    wf = chain("sim", "policy")
    wf = Workflow((Component("sim", resource="cpu"), Component("policy")),
                  wf.edges, global_batch=8)
    cost = AnalyticCostModel({"sim": AnalyticCost(per_item=1.0, replicated=10**6, switch=9),
                              "policy": AnalyticCost(per_item=1.0, replicated=90, switch=1)})
    r = run(wf, "sim,policy: 0-1", cost, Cluster.uniform(1, 2, 100, "H100"))
    assert r.iteration_time == pytest.approx(4 + 4)
    assert r.switch_seconds == 0


def test_a_ready_consumer_fills_the_gap_its_producer_leaves_on_a_shared_device() -> None:
    # a on device 0 (1 s/item) feeds b, which shares device 1 with its consumer c
    # (b 0.25 s/item, c 1 s/item); 4 items in micro-batches of 1. Device 1 runs b0 at 1,
    # then c0 while a makes item 2, and so on: b_k at k+1 .. k+1.25, c_k right after it.
    wf = chain("a", "b", "c", batch=4)
    cost = AnalyticCostModel({"a": AnalyticCost(per_item=1.0), "b": AnalyticCost(per_item=0.25),
                              "c": AnalyticCost(per_item=1.0)})
    r = run(wf, "a: 0, b,c: 1", cost, Cluster.uniform(1, 2, 100, "H100"),
            micro_batch={"a": 1, "b": 1, "c": 1})
    spans = [(i.component, i.chunk, i.start, i.end) for i in r.device_intervals(1)]
    assert spans == [("b", 0, 1.0, 1.25), ("c", 0, 1.25, 2.25), ("b", 1, 2.25, 2.5),
                     ("c", 1, 2.5, 3.5), ("b", 2, 3.5, 3.75), ("c", 2, 3.75, 4.75),
                     ("b", 3, 4.75, 5.0), ("c", 3, 5.0, 6.0)]
    assert r.iteration_time == pytest.approx(6.0)  # all of b before c would end at 8.0


def test_without_idle_time_a_component_keeps_the_device_for_its_calls() -> None:
    # a and b share both devices, every micro-batch of a is ready at once: a's four calls
    # run back to back before b's (no interleaving, hence no extra switch).
    wf = chain("a", "b", batch=4)
    cost = AnalyticCostModel({"a": AnalyticCost(per_item=1.0, replicated=60, switch=0.5),
                              "b": AnalyticCost(per_item=1.0, replicated=60, switch=0.5)})
    r = run(wf, "a,b: 0", cost, Cluster.uniform(1, 1, 100, "H100"),
            micro_batch={"a": 1, "b": 1})
    order = [(i.component, i.kind) for i in r.device_intervals(0)]
    assert order == [("a", "switch"), *[("a", "compute")] * 4, ("b", "switch"),
                     *[("b", "compute")] * 4]
    assert r.iteration_time == pytest.approx(9.0)


def test_component_larger_than_a_device_is_an_error() -> None:
    wf = chain("a", "b")
    cost = AnalyticCostModel({"a": AnalyticCost(per_item=1.0, sharded=300),
                              "b": AnalyticCost(per_item=1.0)})
    cluster = Cluster.uniform(1, 4, 100, "H100")
    with pytest.raises(PlanningError, match="needs 150 bytes per device"):
        run(wf, "a: 0-1, b: 2-3", cost, cluster)
    assert run(wf, "a,b: 0-3", cost, cluster).iteration_time == pytest.approx(4.0)


def test_bad_micro_batch_and_missing_component() -> None:
    wf = chain("a", "b")
    cost = AnalyticCostModel({"a": AnalyticCost(per_item=1.0), "b": AnalyticCost(per_item=1.0)})
    cluster = Cluster.uniform(1, 2, 100, "H100")
    with pytest.raises(PlanningError, match="micro-batch 9"):
        run(wf, "a: 0, b: 1", cost, cluster, {"a": 9})
    placement = parse_placement("a: 0-1", components=["a"], num_devices=2)
    with pytest.raises(PlanningError, match="not placed"):
        simulate(wf, placement, cost, cluster)


def test_switches_evict_least_recently_used_so_a_pair_that_fits_stays() -> None:
    # a and b fit together (40 + 40 of 100), c needs 90: c evicts both, then a and b each
    # onload once; with one-at-a-time switching b would also switch while a is resident.
    wf = chain("a", "b", "c", batch=1)
    cost = AnalyticCostModel({"a": AnalyticCost(per_item=1.0, replicated=40, switch=0.5),
                              "b": AnalyticCost(per_item=1.0, replicated=40, switch=0.5),
                              "c": AnalyticCost(per_item=1.0, replicated=90, switch=0.5)})
    r = run(wf, "a,b,c: 0", cost, Cluster.uniform(1, 1, 100, "H100"))
    assert r.switch_counts == {"a": 1, "b": 1, "c": 1}
    assert r.switches == 3
    assert r.iteration_time == pytest.approx(3 + 1.5)
    # a loop that revisits a and b: they stay co-resident across steps, c never returns.
    wf = Workflow((Component("a"), Component("b"), Component("c")),
                  (Edge("a", "b"), Edge("b", "a", feedback=True), Edge("b", "c")),
                  global_batch=1, loops=(Loop(("a", "b"), steps=3),))
    r = run(wf, "a,b,c: 0", cost, Cluster.uniform(1, 1, 100, "H100"))
    assert r.switch_counts == {"a": 1, "b": 1, "c": 1}


def test_a_switch_starts_once_the_input_has_arrived() -> None:
    # a on device 0 takes 4 s; b and c share device 1 and cannot co-reside. c runs first
    # (no input); b's switch begins when a's output arrives at 4, not when c frees the
    # device at 1 (the lock is requested with the input in hand).
    wf = Workflow((Component("a"), Component("b"), Component("c")),
                  (Edge("a", "b"),), global_batch=1)
    cost = AnalyticCostModel({"a": AnalyticCost(per_item=4.0),
                              "b": AnalyticCost(per_item=1.0, replicated=60, switch=2.0),
                              "c": AnalyticCost(per_item=1.0, replicated=60, switch=2.0)})
    r = run(wf, "a: 0, b,c: 1", cost, Cluster.uniform(1, 2, 100, "H100"))
    spans = [(i.component, i.kind, i.start, i.end) for i in r.device_intervals(1)]
    assert spans == [("c", "switch", 0, 2), ("c", "compute", 2, 3),
                     ("b", "switch", 4, 6), ("b", "compute", 6, 7)]
    assert r.iteration_time == pytest.approx(7.0)


def test_loop_partners_on_the_same_devices_hand_over_nothing_between_steps() -> None:
    # env and rollout take turns for 3 steps, then the actor trains: on one device the
    # runtime runs env and rollout in one process, so the device changes hands twice per
    # iteration (to env at its start, to the actor after the loop), not at every step. (The
    # actor is isolated: otherwise it would share their process and take no turns at all.)
    wf = Workflow((Component("env"), Component("rollout"), Component("actor", isolated=True)),
                  (Edge("env", "rollout"), Edge("rollout", "env", feedback=True),
                   Edge("rollout", "actor")),
                  global_batch=1, loops=(Loop(("env", "rollout"), 3),))
    cost = AnalyticCostModel({"env": AnalyticCost(fixed=1.0), "rollout": AnalyticCost(fixed=1.0),
                              "actor": AnalyticCost(fixed=2.0)})
    plain = Cluster.uniform(1, 1, 100, "H100")
    turns = dataclasses.replace(plain, turn_latency=0.1)
    assert run(wf, "env,rollout,actor: 0", cost, plain).iteration_time == pytest.approx(8.0)
    assert run(wf, "env,rollout,actor: 0", cost, turns).iteration_time == pytest.approx(8.2)
    # Apart, no device is shared, so none is taken in turns (the runtime starts no lock).
    apart = dataclasses.replace(Cluster.uniform(1, 3, 100, "H100"), turn_latency=0.1)
    free = dataclasses.replace(apart, turn_latency=0.0)
    spread = "env: 0, rollout: 1, actor: 2"
    assert run(wf, spread, cost, apart).iteration_time == pytest.approx(
        run(wf, spread, cost, free).iteration_time)
