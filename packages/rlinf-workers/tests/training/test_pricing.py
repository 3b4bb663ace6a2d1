"""`Pricing` prices plans as the flow runs them, with the profile's overheads, and ranks the
planner's plans and the caller's candidates by that price (no Ray needed)."""

from __future__ import annotations

import dataclasses

import pytest

from rlinf.sched import (
    AnalyticCost,
    AnalyticCostModel,
    Cluster,
    CostModel,
    ExecutionPlan,
    Measurement,
    PlannerOptions,
    PlanningError,
    Profile,
    plan,
)
from rlinf.workers.flow.auto import WEIGHT_SYNC
from rlinf.workers.flow.records import EDGE_BYTES
from rlinf.workers.training import Pricing

from ..flow.test_run import ITEMS, declare

FLOW = declare()
BOX = Cluster.uniform(1, 2, "8GiB", "cpu")
COSTS = AnalyticCostModel({"source": AnalyticCost(fixed=0.01, per_item=0.001),
                           "sink": AnalyticCost(fixed=0.02, per_item=0.002)})


def measured(*, weight_sync: float = 0.0) -> Profile:
    """What probes of `COSTS` would measure, with a weight sync of `weight_sync` seconds."""
    points = [Measurement(c, b, n, COSTS.time(c, batch_size=b, num_devices=n), 0, "none")
              for c in ("source", "sink") for b in (ITEMS // 2, ITEMS) for n in (1, 2)]
    if weight_sync:
        points += [Measurement(WEIGHT_SYNC, 1, 1, weight_sync, 0, "none")] * 3
    return Profile(tuple(points))


def plan_of(spec: str) -> ExecutionPlan:
    return FLOW.fixed_plan(spec, num_devices=BOX.num_devices)


class WholeBatch(Pricing):
    """A flow whose sink takes the whole batch in one call, whatever the plan says."""

    def micro_batches(self, plan_: ExecutionPlan) -> dict[str, int]:
        return {**plan_.micro_batch, "sink": ITEMS}


def test_a_plan_is_priced_as_the_flow_runs_it_plus_the_measured_weight_sync() -> None:
    pricing = Pricing(FLOW.to_sched_workflow())
    fixed = plan_of("source,sink: 0-1")
    together = dataclasses.replace(fixed, micro_batch={**fixed.micro_batch, "sink": 2})
    bare, simulation = pricing.price(together, COSTS, BOX)
    assert bare.predicted_time == pytest.approx(simulation.iteration_time)
    synced, _ = pricing.price(together, measured(weight_sync=0.25), BOX)
    assert synced.predicted_time == pytest.approx(bare.predicted_time + 0.25, rel=0.05)
    whole, simulation = WholeBatch(pricing.workflow).price(together, COSTS, BOX)
    sink_calls = [i for i in simulation.intervals if i.component == "sink"]
    one_call = COSTS.time("sink", batch_size=ITEMS, num_devices=2)
    assert sink_calls
    assert [i.end - i.start for i in sink_calls] == pytest.approx([one_call] * len(sink_calls))
    assert whole.predicted_time < bare.predicted_time  # one fixed part, not four


def test_rank_chooses_the_fastest_as_priced_and_lets_candidates_compete() -> None:
    apart = plan_of("source: 0, sink: 1")

    class WithCandidate(WholeBatch):
        def candidates(self, cluster: Cluster) -> tuple[ExecutionPlan, ...]:
            return (apart,)

    pricing = WithCandidate(FLOW.to_sched_workflow())
    choice = pricing.rank(measured(weight_sync=0.1), BOX)
    ranked = choice.ranked.ranked
    assert choice.plan is ranked[0]
    times = [p.predicted_time for p in ranked]
    assert times == sorted(times)
    assert apart.spec in {p.spec for p in ranked}
    for p in ranked:  # each as the flow runs it, the weight sync included
        assert p.predicted_time == pytest.approx(
            pricing.price(p, measured(weight_sync=0.1), BOX)[0].predicted_time)
    assert choice.simulation is not None


def test_ties_go_to_the_planners_order() -> None:
    """Within the tolerance the planner's own first plan (fewest device slots among the
    tied) is kept; without one, the plan priced fastest."""
    workflow = FLOW.to_sched_workflow()
    untied = Pricing(workflow).rank(COSTS, BOX)
    assert untied.plan.predicted_time == min(p.predicted_time for p in untied.ranked.ranked)
    tied = Pricing(workflow)
    tied.tie_tolerance = 1e9  # every plan ties
    planners_first = plan(workflow, COSTS, BOX,
                          options=PlannerOptions(tie_tolerance=1e9)).ranked[0]
    assert tied.rank(COSTS, BOX).plan.spec == planners_first.spec


def test_a_plan_that_does_not_fit_as_run_is_dropped_and_none_fitting_is_an_error() -> None:
    class Heavy(Pricing):
        """The sink needs more memory than a device has where it shares its devices
        (`everywhere`: on every plan)."""

        everywhere = False

        def simulated_costs(self, plan_: ExecutionPlan, cost: CostModel) -> CostModel:
            shared = set(plan_.placement.devices_of("sink")) & set(
                plan_.placement.devices_of("source"))
            if not (shared or self.everywhere):
                return cost
            sink = AnalyticCost(fixed=0.02, per_item=0.002, per_item_memory=1e12)
            return AnalyticCostModel({"source": AnalyticCost(per_item=0.001), "sink": sink})

    heavy = Heavy(FLOW.to_sched_workflow())
    choice = heavy.rank(COSTS, BOX)
    for p in choice.ranked.ranked:
        assert not set(p.placement.devices_of("sink")) & set(p.placement.devices_of("source"))
    heavy.everywhere = True
    with pytest.raises(PlanningError, match="none of the planner's"):
        heavy.rank(COSTS, BOX)


def test_ranking_fits_the_profile_once(monkeypatch: pytest.MonkeyPatch) -> None:
    """Calibration and pricing share one fit of the profile (each fit is a least-squares
    fit per component, device count and curve)."""
    from rlinf.workers.training import pricing as pricing_module

    fits: list[Profile] = []
    real = pricing_module.fit_profile

    def counted(profile: Profile):  # type: ignore[no-untyped-def]
        fits.append(profile)
        return real(profile)

    monkeypatch.setattr(pricing_module, "fit_profile", counted)
    profile = measured(weight_sync=0.1)
    pricing = Pricing(FLOW.to_sched_workflow())
    pricing.rank(profile, BOX)
    assert fits == [profile]
    pricing.rank(measured(weight_sync=0.2), BOX)  # another profile: fitted anew
    assert len(fits) == 2


def test_an_edges_measured_bytes_per_item_replace_the_declared_estimate() -> None:
    """Plans are priced with what the channels carried (`EDGE_BYTES` in the profile), not
    with the declaration's estimate: a heavy edge makes the split plan pay its transfer."""
    apart = plan_of("source: 0, sink: 1")
    declared, _ = Pricing(FLOW.to_sched_workflow()).price(apart, measured(), BOX)
    heavy = dataclasses.replace(measured(), metadata={EDGE_BYTES: {"source->sink": 1e8}})
    pricing = Pricing(FLOW.to_sched_workflow())
    priced, _ = pricing.price(apart, heavy, BOX)
    assert pricing.edge_bytes == {"source->sink": 1e8}
    assert [e.bytes_per_item for e in pricing.priced_workflow(pricing.workflow).edges] == [1e8]
    transfer = ITEMS * 1e8 / BOX.intra_node_bandwidth
    assert priced.predicted_time == pytest.approx(declared.predicted_time + transfer, rel=0.1)
