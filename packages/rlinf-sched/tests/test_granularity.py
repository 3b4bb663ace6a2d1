"""Micro-batch sizes the runtime runs: declared rules, one unit per device, candidates."""

from __future__ import annotations

import itertools
import math

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from rlinf.sched.analytic_costs import AnalyticCost, AnalyticCostModel
from rlinf.sched.cluster import Cluster
from rlinf.sched.errors import PlanningError
from rlinf.sched.granularity import (
    check_micro_batches,
    micro_batch_choices,
    runnable_sizes,
    size_problem,
    size_rule,
    smallest_call,
)
from rlinf.sched.planner import PlannerOptions, plan
from rlinf.sched.workflow import Component, Edge, Loop, Workflow


def chain(batch: int, **declared: object) -> Workflow:
    """a → b, with `declared` fields on b."""
    return Workflow((Component("a"), Component("b", **declared)),  # type: ignore[arg-type]
                    (Edge("a", "b"),), global_batch=batch)


def test_unconstrained_choices_split_the_batch_in_powers_of_two() -> None:
    wf = chain(10)
    assert micro_batch_choices(wf, "a", max_chunks=16) == (10, 5, 3, 2)  # k <= batch
    assert micro_batch_choices(wf, "a", max_chunks=4) == tuple(
        math.ceil(10 / k) for k in (1, 2, 4))


def test_divisors_and_multiples_nearest_each_split() -> None:
    # 20 envs in equal stage groups: 20/8 → 3 is no divisor; 2 and 4 are as near, take 4.
    assert micro_batch_choices(chain(20, micro_batch_divides=True), "b",
                               max_chunks=16) == (20, 10, 5, 4, 2)
    # Whole groups of 16 out of 96: 24 → 32 (tie with 16, the larger), 12 and 6 → 16.
    assert micro_batch_choices(chain(96, micro_batch_multiple=16), "b",
                               max_chunks=16) == (96, 48, 32, 16)
    assert micro_batch_choices(chain(96, micro_batch_multiple=16, micro_batch_divides=True),
                               "b", max_chunks=16) == (96, 48, 32, 16)
    assert micro_batch_choices(chain(96, whole_batch=True), "b", max_chunks=16) == (96,)


def test_a_shared_micro_batch_meets_both_components_rules() -> None:
    wf = Workflow((Component("env", micro_batch_divides=True),
                   Component("policy", micro_batch_multiple=2, same_micro_batch_as="env")),
                  (Edge("env", "policy"), Edge("policy", "env", feedback=True)),
                  global_batch=12, loops=(Loop(("env", "policy"), 3),))
    assert wf.micro_batch_group("policy") == ("env", "policy")
    rule = size_rule(wf, "policy")
    assert (rule.multiple, rule.divides, rule.whole) == (2, True, False)
    assert micro_batch_choices(wf, "env", max_chunks=8) == (12, 6, 4, 2)
    check_micro_batches(wf, {"env": 6, "policy": 6})
    with pytest.raises(PlanningError, match="'policy' has micro-batch 4 but runs with"):
        check_micro_batches(wf, {"env": 6, "policy": 4})


def test_one_unit_per_device_of_every_call() -> None:
    assert smallest_call(10, 4) == 2 and smallest_call(12, 4) == 4
    # On 3 devices: 4 leaves a call of 2 items (4 + 4 + 2), 3 one of 1 item.
    assert runnable_sizes((10, 5, 4, 3, 2, 1), 10, items_per_call=3) == (10, 5)
    wf = chain(64, micro_batch_multiple=8)
    assert size_problem(wf, "b", 16, devices=2) is None
    assert "at least 8 per device (24)" in str(size_problem(wf, "b", 16, devices=3))
    assert "'a' on 128 device(s) has a call of 64" in str(size_problem(wf, "a", 64,
                                                                        devices=128))


@pytest.mark.parametrize(("micro_batch", "devices", "match"), [
    ({"b": 12}, None, "expected a multiple of 8 in 1..64"),
    ({"a": 65}, None, "'a' has micro-batch 65: expected a multiple of 1 in 1..64"),
    ({"b": 8}, {"b": 2}, "expected at least 8 per device"),
])
def test_check_names_the_component_and_what_was_expected(
        micro_batch: dict[str, int], devices: dict[str, int] | None, match: str) -> None:
    with pytest.raises(PlanningError, match=match):
        check_micro_batches(chain(64, micro_batch_multiple=8), micro_batch, devices=devices)


def test_check_fills_in_whole_batches_and_streaming_sizes() -> None:
    wf = Workflow((Component("gen", streaming=True), Component("train", whole_batch=True)),
                  (Edge("gen", "train"),), global_batch=6)
    assert check_micro_batches(wf, {"gen": 1}) == {"gen": 6, "train": 6}
    with pytest.raises(PlanningError, match="'train' has micro-batch 3: expected the whole"):
        check_micro_batches(wf, {"train": 3})


def test_even_splits_and_dividing_device_counts_are_checked() -> None:
    wf = Workflow((Component("env", micro_batch_divides=True, split_evenly=True),
                   Component("policy", same_micro_batch_as="env", split_evenly=True,
                             devices_divide="env")),
                  (Edge("env", "policy"), Edge("policy", "env", feedback=True)),
                  global_batch=12, loops=(Loop(("env", "policy"), 3),))
    assert size_problem(wf, "env", 6, devices=3) is None
    assert "split evenly" in str(size_problem(wf, "env", 4, devices=3))
    check_micro_batches(wf, {"env": 6, "policy": 6}, devices={"env": 2, "policy": 1})
    with pytest.raises(PlanningError, match=r"'policy' runs on 2 device.*divide 'env''s 3"):
        check_micro_batches(wf, {"env": 6, "policy": 6}, devices={"env": 3, "policy": 2})
    cost = AnalyticCostModel({"env": AnalyticCost(per_item=0.01),
                              "policy": AnalyticCost(fixed=0.001, per_item=0.001)})
    result = plan(wf, cost, Cluster.uniform(1, 3, "8GB", "cpu"))
    for p in (*result.ranked, *result.baselines.values()):
        check_micro_batches(wf, p.micro_batch,
                            devices={c.component: c.num_devices for c in p.placement})
    # The env splits over devices when that pays (perfect scaling here).
    assert len(result.best.placement.devices_of("env")) > 1


def test_a_loops_components_share_all_their_devices_or_none() -> None:
    # A runtime process holds its device for its whole part of a loop: env and policy on
    # partly shared devices (env: 0-1, policy: 0) would each wait for the other. The planner
    # proposes the same devices (one runs inside the other) or disjoint ones.
    wf = Workflow((Component("env", micro_batch_divides=True, split_evenly=True),
                   Component("policy", same_micro_batch_as="env", split_evenly=True,
                             devices_divide="env"),
                   Component("actor")),
                  (Edge("env", "policy"), Edge("policy", "env", feedback=True),
                   Edge("env", "actor")),
                  global_batch=12, loops=(Loop(("env", "policy"), 3),))
    cost = AnalyticCostModel({"env": AnalyticCost(per_item=0.01),
                              "policy": AnalyticCost(fixed=0.002, per_item=0.0001),
                              "actor": AnalyticCost(per_item=0.001)})
    result = plan(wf, cost, Cluster.uniform(1, 3, "8GB", "cpu"))
    plans = (*result.ranked, *result.baselines.values())
    assert plans
    for p in plans:
        env, policy = (set(p.placement.devices_of(n)) for n in ("env", "policy"))
        assert env == policy or not env & policy, p.placement.to_spec()


def test_more_devices_than_items_do_not_make_a_plan_faster() -> None:
    # 4096 items on 10,000 devices: at most one device per item, so the time stops falling
    # at 4096 devices (one item each) instead of shrinking with every device added.
    wf = Workflow((Component("rollout"), Component("actor")), (Edge("rollout", "actor"),),
                  global_batch=4096)
    cost = AnalyticCostModel({
        "rollout": AnalyticCost(fixed=0.5, per_item=1.0, replicated=10, switch=1.0),
        "actor": AnalyticCost(fixed=0.5, per_item=2.0, replicated=10, switch=1.0)})
    huge = plan(wf, cost, Cluster.uniform(1250, 8, 100, "H100"))
    assert huge.best.predicted_time == pytest.approx(4.0)  # 1.5 s + 2.5 s, one item each
    for p in (*huge.ranked, *huge.baselines.values()):
        assert max(c.num_devices for c in p.placement) <= 4096
        check_micro_batches(wf, p.micro_batch,
                            devices={c.component: c.num_devices for c in p.placement})


@st.composite
def small_batch_cases(draw: st.DrawFn) -> tuple[Workflow, AnalyticCostModel, Cluster]:
    """Two or three stages with small batches, declared units and divisors, on clusters
    with far more devices than items."""
    unit = draw(st.sampled_from([1, 1, 2, 4]))
    batch = unit * draw(st.integers(1, 24))
    names = ["a", "b", "c"][: draw(st.integers(2, 3))]
    # b may split every call evenly over its devices (env workers), the last stage may need
    # a device count that divides a's (policy processes serving whole env workers).
    comps = tuple(Component(n, streaming=(n == "a" and draw(st.booleans())),
                            micro_batch_multiple=unit if n != "a" else 1,
                            micro_batch_divides=draw(st.booleans()),
                            split_evenly=n == "b" and draw(st.booleans()),
                            devices_divide="a" if n == names[-1] and draw(st.booleans())
                            else None,
                            resource=draw(st.sampled_from(["gpu", "cpu"])))
                  for n in names)
    edges = tuple(Edge(s, d, bytes_per_item=1e6) for s, d in itertools.pairwise(names))
    cost = AnalyticCostModel({n: AnalyticCost(fixed=draw(st.sampled_from([0.0, 0.3])),
                                              per_item=draw(st.floats(0.1, 2.0)),
                                              replicated=40, switch=1.0) for n in names})
    devices = draw(st.sampled_from([4, 16, 64]))
    return (Workflow(comps, edges, global_batch=batch), cost,
            Cluster.uniform(max(1, devices // 8), min(devices, 8), 100, "H100"))


@settings(max_examples=15, deadline=None, derandomize=True, database=None,
          suppress_health_check=[HealthCheck.too_slow])
@given(small_batch_cases())
def test_every_plan_runs_its_micro_batches_with_a_unit_per_device(
        case: tuple[Workflow, AnalyticCostModel, Cluster]) -> None:
    wf, cost, cl = case
    result = plan(wf, cost, cl, options=PlannerOptions(max_chunks=8))
    for p in (*result.ranked, *result.baselines.values()):
        devices = {c.component: c.num_devices for c in p.placement}
        check_micro_batches(wf, p.micro_batch, devices=devices)
        assert p.granularity == {e.key: p.micro_batch[e.dst] for e in wf.edges}
