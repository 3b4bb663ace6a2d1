"""The pricing helpers of `auto` that both apps share: the probe in a profile, the
per-iteration overhead, and the latency fitted to a probe (pure, no Ray)."""

from __future__ import annotations

import pytest

from rlinf.sched import (
    Cluster,
    ExecutionMode,
    ExecutionPlan,
    Measurement,
    Profile,
    parse_placement,
)
from rlinf.workers.flow.auto import (
    COLLOCATED_ITERATION,
    COLLOCATED_PLANS,
    PROBE_ITERATION,
    PROBE_PLAN,
    WEIGHT_SYNC,
    calibrated_cluster,
    collocated_probes,
    fit_latency,
    overhead_seconds,
    pipeline_probe,
)


def _point(component: str, seconds: float, batch: int = 1, devices: int = 1) -> Measurement:
    return Measurement(component, batch, devices, seconds, 0, memory_source="none",
                       timestamp=0.0)


def _collocated(devices: int) -> ExecutionPlan:
    spec = "a,b: 0" if devices == 1 else f"a,b: 0-{devices - 1}"
    placement = parse_placement(spec, components=("a", "b"), num_devices=2)
    return ExecutionPlan(placement, {"a": 4, "b": 4}, {"a->b": 4}, 0.1, 0.5, "probe")


def _probed(pipelined: float | None = None, *, stalled: bool = False) -> Profile:
    """Collocated probes on 1 and 2 devices at 4 and 8 items (three iterations each, one of
    them slow; with `stalled` two of the 8-item ones on 1 device), and a pipelined probe
    measured at `pipelined` seconds."""
    points = [_point(COLLOCATED_ITERATION, seconds, batch, devices)
              for devices in (1, 2) for batch in (4, 8)
              for seconds in (0.1 * batch / devices + 0.03,
                              9.0 if stalled and (devices, batch) == (1, 8)
                              else 0.1 * batch / devices + 0.03, 9.0)]
    metadata: dict[str, object] = {COLLOCATED_PLANS: {str(n): _collocated(n).to_dict()
                                                      for n in (1, 2)}}
    if pipelined is not None:
        points.append(_point(PROBE_ITERATION, pipelined, 8, 2))
        metadata[PROBE_PLAN] = _plan().to_dict()
    return Profile(tuple(points), metadata=metadata)


def _simulated(plan: ExecutionPlan, size: int, cluster: Cluster) -> float:
    """A stand-in simulation: 0.1 s per item over the plan's devices, plus three hand-overs
    per collocated iteration and four messages per pipelined one."""
    devices = len(plan.placement.devices_of("a"))
    if plan.mode is ExecutionMode.COLLOCATED:
        return 0.1 * size / devices + 3 * cluster.turn_latency
    return 0.1 * size + cluster.turn_latency + 4 * cluster.message_latency


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


def test_the_collocated_probes_are_each_device_count_and_size_with_median_seconds() -> None:
    probes = collocated_probes(_probed())
    assert [(len(p.plan.placement.devices_of("a")), p.batch_size) for p in probes] == [
        (1, 4), (1, 8), (2, 4), (2, 8)]
    assert [p.seconds for p in probes] == pytest.approx([0.43, 0.83, 0.23, 0.43])
    assert collocated_probes(Profile((_point(COLLOCATED_ITERATION, 0.5),))) == ()


def test_the_turn_latency_is_fitted_to_the_collocated_probes_then_the_message_latency() -> None:
    base = Cluster.uniform(1, 2, 10**9, "cpu")
    # each collocated iteration measured 0.03 s over its compute: three hand-overs of 0.01 s
    turned = calibrated_cluster(base, _probed(), _simulated)
    assert turned.turn_latency == pytest.approx(0.01, rel=1e-6)
    assert turned.message_latency == 0.0
    # a pipelined probe 0.05 s over its compute and one hand-over: four hops of 0.01 s
    both = calibrated_cluster(base, _probed(pipelined=0.8 + 0.01 + 0.04), _simulated)
    assert (both.turn_latency, both.message_latency) == pytest.approx((0.01, 0.01), rel=1e-6)
    # one probe point stalled in most iterations: the other points' fits decide
    assert calibrated_cluster(base, _probed(stalled=True), _simulated).turn_latency == \
        pytest.approx(0.01, rel=1e-6)
    # nothing probed: nothing fitted
    assert calibrated_cluster(base, Profile((_point("a", 1.0),)), _simulated) == base


def test_plan_flow_reports_a_long_search_and_logs_it_by_default(
        monkeypatch: pytest.MonkeyPatch) -> None:
    import rlinf.workers.flow.auto as auto_module
    from rlinf.sched import PlannerOptions, PlanProgress

    from ..training.test_pricing import BOX, FLOW, measured

    every_simulation = PlannerOptions(progress_every=0.0)
    seen: list[PlanProgress] = []
    ranked = auto_module.plan_flow(FLOW, measured(), BOX, options=every_simulation,
                                   progress=seen.append)
    assert seen and seen[-1].simulations == ranked.evaluated
    logged: list[PlanProgress] = []
    monkeypatch.setattr(auto_module, "_log_progress", logged.append)
    auto_module.plan_flow(FLOW, measured(), BOX, options=every_simulation)
    assert [p.simulations for p in logged] == [p.simulations for p in seen]
