"""Plan trials: which plans `auto` tries, how a trial is measured, which one it keeps (pure,
no Ray: the measuring callable stands in for a launched flow)."""

from __future__ import annotations

import dataclasses
import io

import pytest

from rlinf.sched import ExecutionPlan, parse_placement
from rlinf.workers.errors import ConfigError
from rlinf.workers.flow.trials import (
    PlanTrial,
    fastest,
    format_trials,
    run_trials,
    shortlist,
    try_plans,
)


def _plan(spec: str, predicted: float) -> ExecutionPlan:
    placement = parse_placement(spec, components=("a", "b"), num_devices=2)
    return ExecutionPlan(placement, {"a": 4, "b": 4}, {"a->b": 4}, predicted, 0.5, "test")


PLANS = (_plan("a: 0, b: 1", 1.00), _plan("a,b: 0-1", 1.08), _plan("a: 1, b: 0", 1.12),
         _plan("a: 0-1, b: 1", 2.00))


def test_the_shortlist_is_the_plans_priced_within_the_margin_fastest_first() -> None:
    picked = shortlist(tuple(reversed(PLANS)), limit=3, margin=0.10)
    assert [p.predicted_time for p in picked] == [1.00, 1.08]
    assert [p.predicted_time for p in shortlist(PLANS, limit=2, margin=1.5)] == [1.00, 1.08]
    # nothing priced close enough: the best plan alone, nothing to try
    assert shortlist(PLANS, limit=3, margin=0.0) == (PLANS[0],)


def test_the_shortlist_leaves_out_plans_the_simulation_cannot_tell_apart() -> None:
    # the same mode, message sizes and price as the best: a copy, not an alternative
    twin = _plan("a: 1, b: 0", 1.00)
    coarser = dataclasses.replace(twin, granularity={"a->b": 8})
    picked = shortlist((PLANS[0], twin, coarser, PLANS[1]), limit=2, margin=0.10)
    assert picked == (PLANS[0], coarser)


@pytest.mark.parametrize(("limit", "margin", "message"), [
    (0, 0.1, "limit=0"), (3, -0.1, "margin must be >= 0"), (3, float("nan"), "margin"),
])
def test_a_bad_shortlist_request_is_refused(limit: int, margin: float, message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        shortlist(PLANS, limit=limit, margin=margin)
    with pytest.raises(ConfigError, match="no plans"):
        shortlist((), limit=3, margin=0.1)


def test_trials_leave_out_the_warm_up_and_the_fastest_median_wins() -> None:
    measured = {PLANS[0].spec: [9.0, 1.3, 1.2, 1.4], PLANS[1].spec: [9.0, 1.1, 1.0, 5.0]}
    tried: list[str] = []

    def measure(plan: ExecutionPlan) -> list[float]:
        tried.append(plan.spec)
        return measured[plan.spec]

    trials = try_plans(PLANS[:2], measure, warmup=1)
    assert tried == [PLANS[0].spec, PLANS[1].spec]
    assert [t.step_seconds for t in trials] == [(1.3, 1.2, 1.4), (1.1, 1.0, 5.0)]
    assert [t.seconds for t in trials] == [1.3, 1.1]
    # the second-priced plan ran faster: it is kept, its prediction untouched
    best = fastest(trials)
    assert best.plan is PLANS[1] and best.plan.predicted_time == 1.08
    assert best.to_dict() == {"plan": PLANS[1].spec, "mode": PLANS[1].mode.value,
                              "granularity": {"a->b": 4}, "predicted_s": 1.08,
                              "measured_s": 1.1,
                              "step_seconds": [1.1, 1.0, 5.0]}


def test_a_tie_goes_to_the_better_priced_plan() -> None:
    trials = (PlanTrial(PLANS[0], (1.0,)), PlanTrial(PLANS[1], (1.0,)))
    assert fastest(trials).plan is PLANS[0]
    with pytest.raises(ConfigError, match="no trials"):
        fastest(())


def test_a_trial_too_short_to_measure_is_refused() -> None:
    with pytest.raises(ConfigError, match="ran 1 step"):
        try_plans(PLANS[:1], lambda plan: [1.0], warmup=1)
    with pytest.raises(ConfigError, match="warmup must be >= 0"):
        try_plans(PLANS[:1], lambda plan: [1.0], warmup=-1)
    assert try_plans(PLANS[:1], lambda plan: [2.0], warmup=0)[0].seconds == 2.0


def test_format_trials_stars_the_chosen_plan():
    best_priced, other = PLANS[0], PLANS[1]
    trials = try_plans([best_priced, other], lambda p: [9.0, 0.5 if p is other else 0.7])
    lines = format_trials(trials, fastest(trials)).splitlines()
    assert len(lines) == 2
    assert lines[0].startswith("   ") and "0.700 s measured" in lines[0]
    assert "1.000 s predicted" in lines[0] and lines[0].endswith(best_priced.spec)
    assert lines[1].startswith(" *") and "0.500 s measured" in lines[1]
    assert lines[1].endswith(other.spec)


def test_run_trials_announces_measures_and_stars_the_fastest() -> None:
    out = io.StringIO()
    measured: list[ExecutionPlan] = []

    def measure(plan: ExecutionPlan) -> list[float]:
        measured.append(plan)
        return [9.0, 0.5 if plan is PLANS[1] else 0.7]

    trials = run_trials(PLANS, measure, limit=3, margin=0.10, steps=2, unit="steps", out=out)
    assert [t.plan for t in trials] == measured == [PLANS[0], PLANS[1]]
    lines = out.getvalue().splitlines()
    assert lines[0] == "auto: 2 plans priced within 10% of the best; running each for 2 steps ..."
    assert lines[1:] == format_trials(trials, fastest(trials)).splitlines()
    # nothing priced close enough to the best: nothing runs, nothing is printed
    quiet = io.StringIO()
    assert run_trials(PLANS, measure, limit=3, margin=0.0, steps=2, unit="steps",
                      out=quiet) == ()
    assert quiet.getvalue() == "" and len(measured) == 2
