"""Analytic cost models, cost files (analytic and profiled), Gantt rows and drawing."""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import pytest

from rlinf.sched import CostModel, ProfileError
from rlinf.sched.analytic_costs import AnalyticCost, AnalyticCostModel, load_cost_model
from rlinf.sched.cluster import Cluster
from rlinf.sched.gantt import gantt_rows, plot_gantt
from rlinf.sched.placement import parse_placement
from rlinf.sched.profiler import Measurement, Profile
from rlinf.sched.simulator import simulate
from rlinf.sched.workflow import Component, Edge, Workflow


def test_formula_terms() -> None:
    c = AnalyticCost(fixed=1.0, per_item=2.0, serial_per_item=0.5, sync=0.25, tail=0.5,
                     sharded=800, replicated=10, per_item_memory=4)
    # 1 + 2·(8/4)·(1 + 0.5·ln 8) + 0.5·8 + 0.25·log2 4
    assert c.time(8, 4) == pytest.approx(1 + 4 * (1 + 0.5 * math.log(8)) + 4 + 0.5)
    assert c.memory(8, 4) == 800 // 4 + 10 + 8
    assert AnalyticCost(per_item=1.0).time(0, 1) == 0.0
    with pytest.raises(ProfileError, match="finite number"):
        AnalyticCost(per_item=-1.0)


def test_model_protocol_and_round_trip(tmp_path: Path) -> None:
    model = AnalyticCostModel({"a": AnalyticCost(per_item=1.0, switch=3.0)})
    assert isinstance(model, CostModel)
    assert model.switch_time("a") == 3.0
    with pytest.raises(ProfileError, match="no cost for component 'b'"):
        model.time("b", batch_size=1, num_devices=1)
    path = tmp_path / "costs.json"
    path.write_text(json.dumps(model.to_dict()))
    assert load_cost_model(path) == model


def test_profile_files_are_fitted(tmp_path: Path) -> None:
    ms = [Measurement("a", batch_size=b, num_devices=d, seconds=0.5 + 2.0 * b / d,
                      peak_memory_bytes=100 + 10 * b // d, memory_source="cuda")
          for b in (4, 8, 16) for d in (1, 2, 4)]
    path = tmp_path / "profile.json"
    Profile(tuple(ms), (), {}).save(path)
    model = load_cost_model(path)
    assert model.time("a", batch_size=32, num_devices=4) == pytest.approx(16.5, rel=1e-6)


def test_bad_cost_files(tmp_path: Path) -> None:
    path = tmp_path / "c.json"
    path.write_text(json.dumps({"format": "rlinf-analytic-costs/1", "components": {}}))
    with pytest.raises(ProfileError, match="no 'components'"):
        load_cost_model(path)
    path.write_text(json.dumps({"format": "rlinf-analytic-costs/1",
                                "components": {"a": {"per_itme": 1}}}))
    with pytest.raises(ProfileError, match="unknown key"):
        load_cost_model(path)
    path.write_text("[1, 2]")
    with pytest.raises(ProfileError, match="expected a mapping"):
        load_cost_model(path)


def test_gantt_groups_devices_on_large_clusters_and_draws(tmp_path: Path) -> None:
    wf = Workflow((Component("a"), Component("b")), (Edge("a", "b"),), global_batch=8)
    cost = AnalyticCostModel({"a": AnalyticCost(per_item=1.0, replicated=60, switch=0.5),
                              "b": AnalyticCost(per_item=1.0, replicated=60, switch=0.5)})
    cluster = Cluster.uniform(16, 8, 100, "H100")
    placement = parse_placement("a: 0-31, b: 32-127", components=wf.names, num_devices=128)
    result = simulate(wf, placement, cost, cluster, micro_batch={"a": 4, "b": 4}, record=True)
    rows = gantt_rows(result, num_devices=128, max_rows=16)
    assert [label for label, _ in rows] == ["dev 0-31", "dev 32-127"]
    assert len(gantt_rows(result, num_devices=128, max_rows=128)) == 128
    png = tmp_path / "g.png"
    plot_gantt(result, png, num_devices=128, components=wf.names, max_rows=16)
    assert png.read_bytes()[:4] == b"\x89PNG"


NAN, INF = float("nan"), float("inf")


@pytest.mark.parametrize(
    ("component", "field", "value", "expected"),
    [
        ("env", "per_item", -1, "expected a finite number >= 0"),
        ("env", "per_item", NAN, "expected a finite number >= 0"),
        ("actor", "replicated", INF, "expected a finite number >= 0"),
        ("actor", "sharded", "lots", "expected a finite number >= 0"),
        ("rollout", "switch", True, "expected a finite number >= 0"),
        ("rollout", "fixed", None, "expected a finite number >= 0"),
    ],
)
def test_bad_values_in_a_cost_file_are_refused_by_rlinf_plan(
    run_with_bad: Any, assert_refused: Any, component: str, field: str, value: object,
    expected: str,
) -> None:
    def change(document: dict[str, Any]) -> None:
        document["components"][component][field] = value

    assert_refused(run_with_bad("costs", change), f"components.{component}.{field} is ",
                   expected)


def _profile_document() -> dict[str, Any]:
    ms = [Measurement(c, batch_size=b, num_devices=1, seconds=0.1 * b, peak_memory_bytes=10 * b)
          for c in ("env", "rollout", "actor") for b in (4, 8)]
    switches = [{"component": "actor", "direction": "onload", "seconds": 0.5, "device": 0,
                 "timestamp": 0.0}]
    return {**Profile(tuple(ms), (), {}).to_dict(), "switches": switches}


@pytest.mark.parametrize(
    ("where", "value", "key", "expected"),
    [
        (("measurements", 0, "seconds"), NAN, "measurements[0].seconds is nan", "number >= 0"),
        (("measurements", 1, "batch_size"), 0, "measurements[1].batch_size is 0",
         "integer >= 1"),
        (("measurements", 2, "num_devices"), 1.5, "measurements[2].num_devices is 1.5",
         "integer >= 1"),
        (("measurements", 3, "peak_memory_bytes"), -1,
         "measurements[3].peak_memory_bytes is -1", "integer >= 0"),
        (("switches", 0, "seconds"), INF, "switches[0].seconds is inf", "number >= 0"),
    ],
)
def test_bad_values_in_a_profile_are_refused_by_rlinf_plan(
    run_with_bad: Any, assert_refused: Any, where: tuple[str, int, str], value: object,
    key: str, expected: str,
) -> None:
    def change(document: dict[str, Any]) -> None:
        document.clear()
        document.update(_profile_document())
        section, index, field = where
        document[section][index][field] = value

    assert_refused(run_with_bad("costs", change), key, expected)


def test_a_valid_profile_plans(run_with_bad: Any) -> None:
    code, err, _ = run_with_bad("costs", lambda d: (d.clear(), d.update(_profile_document())))
    assert code == 0, err


def test_yaml_cost_file_with_exponents(tmp_path: Path) -> None:
    # PyYAML reads 30e9 as a string; the module docstring's example must still load.
    pytest.importorskip("yaml")
    path = tmp_path / "c.yaml"
    path.write_text("format: rlinf-analytic-costs/1\n"
                    "components:\n  rollout: {fixed: 2.0, replicated: 30e9, switch: 4}\n")
    model = load_cost_model(path)
    assert model.memory("rollout", batch_size=1, num_devices=1) == 30 * 10**9
