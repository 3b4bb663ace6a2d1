"""The pricing helpers of `auto` that both apps share: the probe in a profile, the
per-iteration overhead, and the latency fitted to a probe (pure, no Ray)."""

from __future__ import annotations

import pytest

from rlinf.sched import ExecutionMode, ExecutionPlan, Measurement, Profile, parse_placement
from rlinf.workers.flow import (
    PROBE_ITERATION,
    PROBE_PLAN,
    WEIGHT_SYNC,
    fit_latency,
    overhead_seconds,
    pipeline_probe,
)


def _point(component: str, seconds: float, batch: int = 1) -> Measurement:
    return Measurement(component, batch, 1, seconds, 0, memory_source="none", timestamp=0.0)


def _plan() -> ExecutionPlan:
    placement = parse_placement("a: 0, b: 1", components=("a", "b"), num_devices=2)
    assert placement.mode is ExecutionMode.DISAGGREGATED
    return ExecutionPlan(placement, {"a": 4, "b": 4}, {"a->b": 4}, 0.1, 0.5, "probe")


def test_the_probe_is_its_plan_batch_and_median_seconds() -> None:
    plan = _plan()
    profile = Profile((_point(PROBE_ITERATION, 0.5, 8), _point(PROBE_ITERATION, 0.9, 8),
                       _point(PROBE_ITERATION, 0.6, 8), _point("a", 1.0)),
                      metadata={PROBE_PLAN: plan.to_dict()})
    probe = pipeline_probe(profile)
    assert probe is not None
    assert (probe.plan.spec, probe.batch_size, probe.seconds) == (plan.spec, 8, 0.6)


def test_no_probe_without_its_iterations_or_its_plan() -> None:
    plan = _plan()
    assert pipeline_probe(Profile((_point("a", 1.0),), metadata={PROBE_PLAN: plan.to_dict()})
                          ) is None
    assert pipeline_probe(Profile((_point(PROBE_ITERATION, 0.5),))) is None


def test_the_overhead_sums_the_median_of_each_named_component() -> None:
    profile = Profile((_point(WEIGHT_SYNC, 0.004), _point(WEIGHT_SYNC, 0.006),
                       _point(WEIGHT_SYNC, 0.5), _point("control", 0.01), _point("a", 1.0)))
    assert overhead_seconds(profile) == pytest.approx(0.006)
    assert overhead_seconds(profile, (WEIGHT_SYNC, "control")) == pytest.approx(0.016)
    assert overhead_seconds(profile, ("absent",)) == 0.0


def test_the_fitted_latency_makes_the_simulation_meet_the_measurement() -> None:
    messages = 12

    def simulated(latency: float) -> float:  # a dataflow of 0.2 s plus one hop per message
        return 0.2 + messages * latency

    latency = fit_latency(0.0, 0.5, simulated)
    assert simulated(latency) == pytest.approx(0.5, rel=1e-6)
    assert latency == pytest.approx(0.3 / messages, rel=1e-6)


def test_the_latency_is_never_lowered() -> None:
    assert fit_latency(0.01, 0.1, lambda latency: 0.2 + latency) == 0.01  # already slower
    assert fit_latency(0.01, 0.0, lambda latency: 0.2 + latency) == 0.01  # nothing to fit


def test_a_gap_no_latency_explains_leaves_the_latency_alone() -> None:
    """A probe that sends no messages: its simulated time does not depend on the latency,
    and bisecting anyway ended at a latency of about the target (seconds per message)."""
    assert fit_latency(1e-4, 0.5, lambda latency: 0.2) == 1e-4
