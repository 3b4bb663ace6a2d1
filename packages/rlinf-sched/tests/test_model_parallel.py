"""`TrainerCost`: the cuts a trainer's shape allows, their price (compute split, tensor
all-reduces, the pipeline bubble, gradient all-reduce), the memory limit, cost files and
the cut the planner records."""

from __future__ import annotations

import dataclasses
import json
import math
from pathlib import Path

import pytest

from rlinf.sched import Cluster, Component, Workflow, exhaustive_search, plan
from rlinf.sched.analytic_costs import AnalyticCost, AnalyticCostModel, load_cost_model
from rlinf.sched.cli import main
from rlinf.sched.errors import ProfileError
from rlinf.sched.model_parallel import CutPricedCosts, ParallelCut, TrainerCost, format_cut

QWEN_7B = TrainerCost(parameters=7.6e9, layers=28, hidden=3584, heads=28, kv_heads=4,
                      vocab=152064, tokens_per_item=1536, micro_batch=4, device_flops=989e12,
                      bandwidth=4.5e11, device_memory=80e9)


def test_cuts_follow_the_models_shape() -> None:
    cuts = QWEN_7B.cuts(8)
    degrees = {(c.tensor, c.pipeline, c.data) for c in cuts}
    assert (2, 2, 2) in degrees and (4, 1, 2) in degrees
    assert all(c.tensor * c.pipeline * c.data == 8 for c in cuts)
    # Sequence parallelism wherever TP > 1, the distributed optimizer wherever DP > 1.
    assert all(c.sequence_parallel == (c.tensor > 1) for c in cuts)
    assert all(c.distributed_optimizer == (c.data > 1) for c in cuts)
    assert format_cut(ParallelCut(2, 1, 4, True, True).to_dict()) == "tp2 pp1 dp4 sp dopt"
    assert format_cut(ParallelCut(1, 2, 1).to_dict()) == "tp1 pp2 dp1"
    assert not any(c.tensor == 8 for c in cuts)  # 4 key/value heads
    assert not any(c.pipeline == 8 for c in cuts)  # 28 layers


def test_memory_shrinks_with_model_parallelism_and_the_limit_decides() -> None:
    batch = 256
    replica = QWEN_7B.memory_of(ParallelCut(1, 1, 8), batch)
    assert replica > 80e9  # 16 bytes per parameter alone is 122 GB
    assert QWEN_7B.memory_of(ParallelCut(2, 2, 2, True, True), batch) < replica / 3
    chosen = QWEN_7B.cut(batch, 8)
    assert chosen is not None and QWEN_7B.memory_of(chosen, batch) <= 80e9
    assert chosen.tensor * chosen.pipeline >= 2


def test_the_bubble_and_the_collectives_are_priced() -> None:
    trainer = TrainerCost(parameters=1e9, layers=8, hidden=2048, heads=16, kv_heads=16,
                          vocab=32000, tokens_per_item=1024, micro_batch=1, bandwidth=1e10)
    # Pipeline: with as many micro-batches as stages, (m + pp - 1) / m of the ideal time.
    ideal = trainer.seconds(ParallelCut(1, 1, 1), 4) / 4
    pp4 = trainer.seconds(ParallelCut(1, 4, 1), 4)
    assert pp4 > 4 * ideal * (4 + 3) / 4 / 4  # bubble plus the sends
    # Tensor parallelism pays all-reduces that data parallelism does not, per micro-batch.
    tp2 = trainer.seconds(ParallelCut(2, 1, 1), 8)
    assert tp2 > trainer.seconds(ParallelCut(1, 1, 1), 8) / 2
    # More data-parallel replicas: the gradient all-reduce grows, the compute shrinks.
    assert trainer.seconds(ParallelCut(1, 1, 2), 64) < trainer.seconds(ParallelCut(1, 1, 1), 64)


def test_a_device_count_without_a_fitting_cut_reports_the_memory_it_needs() -> None:
    # 5 divides neither the heads nor the layers: only data parallelism, whole replicas.
    replicas = dataclasses.replace(QWEN_7B, distributed_optimizer=0)
    assert replicas.cut(16, 5) == ParallelCut(1, 1, 5)
    assert replicas.memory(16, 5) > 80e9  # so the planner cannot place the actor there
    assert math.isfinite(replicas.time(16, 5))


def test_sequence_parallelism_and_the_distributed_optimizer_cost_memory_not_time() -> None:
    batch = 64
    plain, sp, dopt, both = (ParallelCut(2, 2, 2, s, d) for s, d in (
        (False, False), (True, False), (False, True), (True, True)))
    memory = {c: QWEN_7B.memory_of(c, batch) for c in (plain, sp, dopt, both)}
    # Sequence parallelism splits the 10 h bytes per token and layer that TP leaves whole.
    micro = 2  # min(micro-batches, pp) in flight
    tokens = QWEN_7B.micro_batch * QWEN_7B.tokens_per_item
    saved = micro * tokens * 10 * QWEN_7B.hidden * (1 - 1 / 2) * QWEN_7B.layers / 2
    assert memory[plain] - memory[sp] == pytest.approx(saved, rel=1e-9)
    # The distributed optimizer keeps half the moments on each of two replicas.
    assert memory[plain] - memory[dopt] == pytest.approx(7.6e9 * 8 / 2 / 4, rel=1e-9)
    assert memory[both] < min(memory[sp], memory[dopt])
    assert len({QWEN_7B.seconds(c, batch) for c in memory}) == 1
    # Five whole replicas each keep a fifth of the moments.
    assert QWEN_7B.cut(16, 5) == ParallelCut(1, 1, 5, distributed_optimizer=True)
    assert dataclasses.replace(QWEN_7B, distributed_optimizer=0).memory(16, 5) - \
        QWEN_7B.memory(16, 5) == pytest.approx(7.6e9 * 8 * 4 / 5, rel=1e-9)


def test_cost_files_take_a_trainer_entry_and_refuse_bad_ones(tmp_path: Path) -> None:
    good = {"format": "rlinf-analytic-costs/1", "components": {
        "actor": {"trainer": {"parameters": "7.6e9", "layers": 28, "hidden": 3584,
                              "heads": 28, "kv_heads": 4, "vocab": 152064,
                              "tokens_per_item": 1536}}}}
    path = tmp_path / "costs.json"
    path.write_text(json.dumps(good))
    model = load_cost_model(path)
    assert isinstance(model, AnalyticCostModel)
    assert isinstance(model.costs["actor"], TrainerCost)
    assert model.costs["actor"].layers == 28
    assert AnalyticCostModel.from_dict(model.to_dict()) == model
    for bad, message in (({"layers": 28.5}, "whole number"), ({"parameters": -1}, ">= 0"),
                         ({"heads": 0}, "expected > 0"), ({"oops": 1}, "unknown key"),
                         ({"sequence_parallel": 2}, "1 \\(on\\) or 0"),
                         ({"optimizer_bytes_per_parameter": 20}, "exceeds")):
        entry = {**good["components"]["actor"]["trainer"], **bad}
        path.write_text(json.dumps({**good, "components": {"actor": {"trainer": entry}}}))
        with pytest.raises(ProfileError, match=message):
            load_cost_model(path)
    path.write_text(json.dumps({**good, "components": {"actor": {"trainer": {}, "fixed": 1}}}))
    with pytest.raises(ProfileError, match="stands alone"):
        load_cost_model(path)


def test_the_planner_records_the_cut_it_priced(tmp_path: Path, capsys) -> None:
    workflow = Workflow((Component("rollout", batch=64),
                         Component("actor", batch=64, device_multiple=2)),
                        global_batch=64, name="train")
    cost = AnalyticCostModel({"rollout": AnalyticCost(per_item=0.05, replicated=1e9),
                              "actor": QWEN_7B})
    cluster = Cluster.uniform(1, 8, int(80e9))
    result = plan(workflow, cost, cluster)  # the planner annotates its plans
    best = result.best
    cut = best.parallelism["actor"]
    devices = len(best.placement.components["actor"].devices)
    assert cut["tensor"] * cut["pipeline"] * cut["data"] == devices
    assert cut["tensor"] * cut["pipeline"] >= 2  # a replica does not fit one device
    exhaustive = exhaustive_search(workflow, cost, cluster).best
    assert exhaustive.parallelism["actor"]["tensor"] * exhaustive.parallelism["actor"][
        "pipeline"] >= 2
    # The plan file and the table carry it.
    (tmp_path / "w.json").write_text(json.dumps(workflow.to_dict()))
    (tmp_path / "c.json").write_text(json.dumps(cost.to_dict()))
    (tmp_path / "k.json").write_text(json.dumps(cluster.to_dict()))
    assert main([str(tmp_path / n) for n in ("w.json", "c.json", "k.json")]
                + ["--out", str(tmp_path / "plan.json"), "--gantt", ""]) == 0
    assert "actor: tp" in capsys.readouterr().out
    saved = json.loads((tmp_path / "plan.json").read_text())
    assert saved["best"]["parallelism"]["actor"] == cut


def test_measured_data_parallel_costs_are_priced_under_the_chosen_cut() -> None:
    """`CutPricedCosts`: the measured time times the model's ratio of the chosen cut to data
    parallelism alone; memory likewise; devices no cut fits priced at the modelled need."""
    base = AnalyticCostModel({"actor": AnalyticCost(fixed=1.0, per_item=0.5, replicated=1e9),
                              "rollout": AnalyticCost(per_item=0.1)})
    small = dataclasses.replace(QWEN_7B, device_memory=60e9)
    priced = CutPricedCosts(base, small)
    batch = 64
    chosen = small.cut(batch, 8)
    assert chosen.tensor * chosen.pipeline >= 2  # a replica does not fit 60 GB
    data_only = ParallelCut(1, 1, 8)  # as measured
    ratio = small.seconds(chosen, batch) / small.seconds(data_only, batch)
    assert priced.time("actor", batch_size=batch, num_devices=8) == pytest.approx(
        base.time("actor", batch_size=batch, num_devices=8) * ratio)
    assert priced.memory("actor", batch_size=batch, num_devices=8) < base.memory(
        "actor", batch_size=batch, num_devices=8)
    assert priced.memory("actor", batch_size=batch, num_devices=8) == int(
        base.memory("actor", batch_size=batch, num_devices=8)
        * small.memory_of(chosen, batch) / small.memory_of(data_only, batch))
    assert priced.time("rollout", batch_size=batch, num_devices=8) == base.time(
        "rollout", batch_size=batch, num_devices=8)
    # One device holds no cut of a 7B trainer in 60 GB: priced at what it would need.
    assert priced.memory("actor", batch_size=batch, num_devices=1) > 60e9
    assert priced.costs == {"actor": small}  # annotate_cuts records the cut per plan
