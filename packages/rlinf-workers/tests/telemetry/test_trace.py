from __future__ import annotations

import json
import pickle
import time
from pathlib import Path

import pytest

from rlinf.sched import Component, Edge, Workflow, simulate
from rlinf.sched.analytic_costs import AnalyticCost, AnalyticCostModel
from rlinf.sched.cluster import Cluster
from rlinf.sched.placement import parse_placement
from rlinf.workers.errors import ConfigError
from rlinf.workers.telemetry import Span, TraceRecorder, predicted_spans, write_chrome_trace


def test_recorder_times_blocks_and_drains() -> None:
    rec = TraceRecorder("rollout/0")
    with rec.span("generate", batch=8):
        time.sleep(0.01)
    with pytest.raises(RuntimeError), rec.span("failing"):
        raise RuntimeError("x")
    rec.add("train", 10.0, 12.5, step=3)
    spans = rec.drain()
    assert [s.name for s in spans] == ["generate", "failing", "train"]
    assert spans[0].track == "rollout/0" and spans[0].args == {"batch": 8}
    assert spans[0].duration >= 0.01
    assert spans[2] == Span("rollout/0", "train", 10.0, 12.5, {"step": 3})
    assert rec.drain() == []
    assert pickle.loads(pickle.dumps(spans)) == spans  # shipped from workers to the driver


def test_disabled_recorder_records_nothing() -> None:
    rec = TraceRecorder("x", enabled=False)
    with rec.span("a"):
        pass
    rec.add("b", 0.0, 1.0)
    assert rec.drain() == []


def test_span_rejects_negative_duration() -> None:
    with pytest.raises(ConfigError, match="before"):
        Span("t", "n", 2.0, 1.0)


def test_chrome_trace_has_labelled_tracks_and_microsecond_events(tmp_path: Path) -> None:
    measured = [Span("rollout/0", "generate", 100.0, 100.5), Span("actor/0", "train", 100.5, 101.0),
                Span("actor/0", "train", 101.0, 101.25, {"step": 2})]
    predicted = [Span("rollout", "rollout", 100.0, 100.4)]
    doc = json.loads(write_chrome_trace(tmp_path / "t.json", measured,
                                        predicted=predicted).read_text())
    events = doc["traceEvents"]
    procs = {e["pid"]: e["args"]["name"] for e in events if e["name"] == "process_name"}
    assert sorted(procs.values()) == ["measured", "predicted"]
    threads = {(procs[e["pid"]], e["args"]["name"]): e["tid"]
               for e in events if e["name"] == "thread_name"}
    assert set(threads) == {("measured", "actor/0"), ("measured", "rollout/0"),
                            ("predicted", "rollout")}
    complete = [e for e in events if e["ph"] == "X"]
    assert len(complete) == 4
    train = [e for e in complete if e["name"] == "train"]
    assert [(e["ts"], e["dur"]) for e in train] == [(500000.0, 500000.0), (1000000.0, 250000.0)]
    assert {e["tid"] for e in train} == {threads[("measured", "actor/0")]}
    assert train[1]["args"] == {"step": 2}


def test_predicted_spans_follow_the_simulated_intervals() -> None:
    wf = Workflow((Component("rollout"), Component("actor")), (Edge("rollout", "actor"),),
                  global_batch=8)
    cost = AnalyticCostModel({"rollout": AnalyticCost(per_item=0.5, switch=0.25),
                              "actor": AnalyticCost(per_item=0.25, switch=0.25)})
    cluster = Cluster.uniform(1, 2, 100, "H100")
    placement = parse_placement("rollout: 0, actor: 1", components=wf.names, num_devices=2)
    result = simulate(wf, placement, cost, cluster, micro_batch={"rollout": 4, "actor": 4},
                      record=True)
    spans = predicted_spans(result, origin=1000.0)
    assert len(spans) == len(result.intervals) == 4
    assert {s.track for s in spans} == {"rollout", "actor"}
    assert min(s.start for s in spans) == pytest.approx(1000.0)
    assert max(s.end for s in spans) == pytest.approx(1000.0 + result.iteration_time)
    by_track = {t: [(s.start - 1000.0, s.end - 1000.0) for s in spans if s.track == t]
                for t in ("rollout", "actor")}
    assert by_track["rollout"] == [(0.0, 2.0), (2.0, 4.0)]  # 4 items x 0.5 s per call
    assert all(s.args["kind"] == "compute" and s.name == s.track for s in spans)
    with pytest.raises(ConfigError, match="record=True"):
        predicted_spans(simulate(wf, placement, cost, cluster))


def test_switch_intervals_become_switch_spans() -> None:
    wf = Workflow((Component("rollout"), Component("actor")), (Edge("rollout", "actor"),),
                  global_batch=4)
    cost = AnalyticCostModel({"rollout": AnalyticCost(per_item=1.0, replicated=60, switch=0.5),
                              "actor": AnalyticCost(per_item=1.0, replicated=60, switch=0.5)})
    cluster = Cluster.uniform(1, 1, 100, "H100")
    placement = parse_placement("rollout,actor: 0", components=wf.names, num_devices=1)
    result = simulate(wf, placement, cost, cluster, record=True)
    spans = predicted_spans(result)
    switches = [s for s in spans if s.name == "switch"]
    assert switches and all(s.args["kind"] == "switch" for s in switches)
    assert len(switches) == sum(1 for i in result.intervals if i.kind == "switch")
