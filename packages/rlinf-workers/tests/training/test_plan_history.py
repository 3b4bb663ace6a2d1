"""`plan_history`: what runs measured of their plans, kept in a profile, and ``auto``'s
ranking corrected by it."""

from __future__ import annotations

import dataclasses

import pytest

from rlinf.sched import ExecutionPlan, PlanningError, PlanResult, Profile, parse_placement
from rlinf.workers.training.plan_history import (
    KEEP,
    MEASURED_PLANS,
    RUNS_KEPT,
    MeasuredPlan,
    calibrated,
    measured_plans,
    merge_measured,
    model_error,
    plan_key,
    with_measured,
)

COMPONENTS = ("rollout", "actor")


def plan(spec: str, seconds: float = 1.0, **micro_batch: int) -> ExecutionPlan:
    return ExecutionPlan(parse_placement(spec, components=COMPONENTS, num_devices=4),
                         micro_batch={"rollout": 8, "actor": 8, **micro_batch},
                         granularity={"rollout->actor": 8}, predicted_time=seconds,
                         utilisation=0.5)


COLLOCATED = plan("rollout,actor: 0-1")
SPLIT = plan("rollout: 0-1, actor: 2-3")
WIDE = plan("rollout,actor: 0-3")


def test_a_plan_is_the_same_run_only_with_the_same_batches() -> None:
    assert plan_key(COLLOCATED) == plan_key(dataclasses.replace(COLLOCATED, predicted_time=9))
    assert plan_key(COLLOCATED) != plan_key(plan("rollout,actor: 0-1", actor=4))
    assert plan_key(COLLOCATED) != plan_key(SPLIT)


def test_a_record_keeps_the_newest_runs_their_median_and_the_first_model_price() -> None:
    profile = Profile()
    for i, seconds in enumerate([0.30, 0.20, 0.21, 0.22, 0.50, 0.23]):
        profile = with_measured(profile, MeasuredPlan(SPLIT, (seconds,),
                                                      modeled=0.1 if i == 0 else 0.9))
    record = measured_plans(Profile.from_dict(profile.to_dict()))[plan_key(SPLIT)]
    assert record.runs == (0.20, 0.21, 0.22, 0.50, 0.23) and len(record.runs) == RUNS_KEPT
    assert record.seconds == pytest.approx(0.22)
    assert record.modeled == 0.1 and record.error == pytest.approx(2.2)
    assert MeasuredPlan(COLLOCATED, (0.2,)).error is None
    for bad in ((0.0,), (float("nan"),), ()):
        with pytest.raises(ValueError, match="MeasuredPlan"):
            MeasuredPlan(COLLOCATED, bad)


def test_records_that_do_not_read_are_skipped_and_the_newest_plans_kept() -> None:
    good = MeasuredPlan(COLLOCATED, (0.2,)).to_dict()
    profile = Profile(metadata={MEASURED_PLANS: {"x": {"plan": {}}, "y": good}})
    assert list(measured_plans(profile)) == ["y"]
    merged = merge_measured({str(i): i for i in range(KEEP)}, {"new": 1, "0": 2})
    assert len(merged) == KEEP and list(merged)[-2:] == ["new", "0"] and "1" not in merged


def test_the_model_error_is_its_worst_underestimate_and_never_below_one() -> None:
    history = {"a": MeasuredPlan(COLLOCATED, (0.2,)),
               "b": MeasuredPlan(SPLIT, (0.3,), modeled=0.2),
               "c": MeasuredPlan(WIDE, (0.1,), modeled=0.2)}
    assert model_error(history) == pytest.approx(1.5)
    assert model_error({"c": history["c"]}) == 1.0 and model_error({}) == 1.0


def test_measured_plans_are_priced_as_measured_the_others_by_the_model_times_its_error(
) -> None:
    ranked = PlanResult((dataclasses.replace(SPLIT, predicted_time=0.15),
                         dataclasses.replace(WIDE, predicted_time=0.18)),
                        baselines={"collocated": dataclasses.replace(WIDE, predicted_time=0.18)})
    history = {plan_key(SPLIT): MeasuredPlan(SPLIT, (0.30,), modeled=0.15),
               plan_key(COLLOCATED): MeasuredPlan(COLLOCATED, (0.25,))}
    priced: list[str] = []

    def price(p: ExecutionPlan) -> ExecutionPlan:
        priced.append(p.spec)
        return dataclasses.replace(p, predicted_time=0.01)

    fixed = calibrated(ranked, history, price)
    assert fixed.error == pytest.approx(2.0)
    assert [(p.spec, round(p.predicted_time, 3)) for p in fixed.result.ranked] == [
        (COLLOCATED.spec, 0.25), (SPLIT.spec, 0.30), (WIDE.spec, 0.36)]
    assert fixed.result.baselines["collocated"].predicted_time == pytest.approx(0.36)
    assert priced == [COLLOCATED.spec]  # only the plan the ranking left out
    assert fixed.fallback is None  # the best is a measured plan
    assert fixed.measured == {plan_key(SPLIT), plan_key(COLLOCATED)}


def test_an_unmeasured_plan_the_corrected_model_still_prices_fastest_gets_a_fallback() -> None:
    ranked = PlanResult((dataclasses.replace(WIDE, predicted_time=0.10),))
    history = {plan_key(SPLIT): MeasuredPlan(SPLIT, (0.30,), modeled=0.25),
               plan_key(COLLOCATED): MeasuredPlan(COLLOCATED, (0.26,)),
               "stale": MeasuredPlan(plan("rollout: 0, actor: 1"), (0.01,))}

    def price(p: ExecutionPlan) -> ExecutionPlan:
        if p.spec == "rollout: 0, actor: 1":
            raise PlanningError("no longer fits")
        return p

    fixed = calibrated(ranked, history, price)
    assert fixed.result.best.spec == WIDE.spec
    assert fixed.result.best.predicted_time == pytest.approx(0.12)
    assert fixed.fallback is not None and fixed.fallback.plan.spec == COLLOCATED.spec
    assert fixed.fallback.seconds == pytest.approx(0.26)
    assert [p.spec for p in fixed.result.ranked] == [WIDE.spec, COLLOCATED.spec, SPLIT.spec]
