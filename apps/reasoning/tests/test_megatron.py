"""``actor.backend=megatron`` through ``rlinf-reasoning`` in every placement mode: the same
seed gives the metrics of the DDP actor (the trainer is cut by tensor or pipeline
parallelism, with sequence parallelism in the hybrid mode, or by data parallelism with the
distributed optimizer in the collocated mode, or as the planner chose with actor.cut=auto;
the rest of the flow unchanged), and bad cuts fail at config time."""

from __future__ import annotations

import json
import math
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import torch
from rlinf_reasoning.placement import resolve_placement

sys.path.insert(0, str(Path(__file__).parent))
from test_run import cli_command, cli_env, run_cli, stable

pytest.importorskip("megatron.core", reason="needs the megatron extra")
pytestmark = pytest.mark.timeout(900)

MEGATRON = ("actor.backend=megatron",)

MODES = {
    # Fixed placements unpriced: profiling is auto's part, and starting probes is slow here.
    "collocated": ("placement=collocated", "cluster.cpu_slots=2",
                   "actor.distributed_optimizer=true", "run.predict=false"),
    "hybrid": ("placement=hybrid", "cluster.cpu_slots=4", "actor.tensor_parallel=2",
               "actor.sequence_parallel=true", "run.predict=false"),
    "disaggregated": ("placement='rollout: 0, reward: 1, inference: 2, actor: 3-4'",
                      "cluster.cpu_slots=5", "actor.pipeline_parallel=2", "run.predict=false"),
    # auto's trials are test_run's: here the best-priced plan launches untried. Auto with a
    # fixed cut (actor.tensor_parallel=2) is not run here: that the planner moves whole
    # model-parallel groups is test_planning's, and auto-cut runs the same launch path.
    "auto-cut": ("placement=auto", "cluster.cpu_slots=2", "actor.cut=auto", "run.trial_plans=0"),
}


def _metrics(run_dir: Path) -> list[dict[str, float]]:
    lines = (run_dir / "metrics.jsonl").read_text().splitlines()
    return [stable(json.loads(line)) for line in lines if '"step"' in line]


def _summary(run_dir: Path) -> dict[str, Any]:
    return json.loads((run_dir / "summary.json").read_text())


@pytest.fixture(scope="module")
def reference_dir(tmp_path_factory: pytest.TempPathFactory, ray_address: str) -> Path:
    """A run of the DDP actor, collocated on 2 slots, same seed."""
    run_dir = tmp_path_factory.mktemp("ddp")
    run_cli(run_dir, "placement=collocated", "cluster.cpu_slots=2", "run.predict=false",
            ray_address=ray_address)
    return run_dir


@pytest.fixture(scope="module")
def reference(reference_dir: Path) -> list[dict[str, float]]:
    return _metrics(reference_dir)


@pytest.mark.parametrize("mode", list(MODES))
def test_megatron_actor_trains_like_ddp_in_every_mode(reference, reference_dir: Path,
                                                      tmp_path: Path, mode: str,
                                                      ray_address: str) -> None:
    run_cli(tmp_path, *MEGATRON, *MODES[mode], ray_address=ray_address)
    got = _metrics(tmp_path)
    assert len(got) == len(reference)
    for mine, theirs in zip(got, reference, strict=True):
        assert set(mine) == set(theirs)
        for key, value in theirs.items():
            assert mine[key] == pytest.approx(value, rel=1e-3, abs=1e-5), (mode, key)
    summary = _summary(tmp_path)
    placement = resolve_placement(summary["placement"],
                                  ("rollout", "reward", "inference", "actor"), 5)
    if mode != "auto-cut":
        assert len(placement.devices_of("actor")) % 2 == 0  # whole model-parallel groups
    if mode == "auto-cut":  # the planner's cut, over the actor's devices, and its prediction
        assert summary["predicted_iteration_s"] > 0 and summary["measured_iteration_s"] > 0
        cut = summary["parallelism"]["actor"]
        assert cut["tensor"] * cut["pipeline"] * cut["data"] == len(
            placement.devices_of("actor"))
        # A resume launches the checkpoint's plan, cut included, and goes on from it.
        resumed = run_cli(tmp_path, *MEGATRON, *MODES[mode], "run.steps=3", "--resume",
                          ray_address=ray_address)
        assert "resuming from step 2" in resumed.stdout
        assert _summary(tmp_path)["parallelism"] == summary["parallelism"]
        assert len(_metrics(tmp_path)) > len(reference)
    else:
        assert summary["parallelism"] == {}
    if mode == "disaggregated":
        _exports_like_ddp(tmp_path, reference_dir)
    if mode == "collocated":
        _optimizer_state_is_split(tmp_path)


def _optimizer_state_is_split(run_dir: Path) -> None:
    """The two data-parallel replicas' checkpoint files hold one copy of AdamW's two moments
    between them, half each (to the padding of the last range)."""
    last = sorted((run_dir / "checkpoints").glob("step-*"))[-1] / "actor"
    files = [torch.load(last / f"rank{r}.pt", weights_only=False) for r in range(2)]
    parameters = sum(t.numel() for t in files[0]["model"].values()
                     if isinstance(t, torch.Tensor))  # megatron's _extra_state is None
    held = [sum(v.numel() for state in f["optimizer"]["state"].values()
                for key, v in state.items() if key != "step") for f in files]
    assert sum(held) == 2 * parameters
    assert max(held) - min(held) <= 2


def _exports_like_ddp(run_dir: Path, reference_dir: Path) -> None:
    """The pipeline-parallel checkpoint exports to a Hugging Face folder with every weight
    of the model, scoring tokens as the DDP run's export does. Not to float rounding:
    the warm start's gradients are so small that many sit near AdamW's epsilon, where
    the first steps move a weight by about +-lr on the sign of float noise (the gradients
    themselves agree to 1e-4, tests/actor/megatron); seen 0.006 in log-probs after two
    steps, against 4e-5 between DDP on 2 ranks and 1."""
    from rlinf_reasoning.export import export_checkpoint
    from transformers import AutoModelForCausalLM

    mine = AutoModelForCausalLM.from_pretrained(export_checkpoint(run_dir, run_dir / "hf"))
    theirs = AutoModelForCausalLM.from_pretrained(
        export_checkpoint(reference_dir, reference_dir / "hf"))
    assert set(mine.state_dict()) == set(theirs.state_dict())
    ids = torch.arange(4, 60).reshape(4, 14)
    with torch.no_grad():
        got = torch.log_softmax(mine(input_ids=ids).logits, dim=-1)
        want = torch.log_softmax(theirs(input_ids=ids).logits, dim=-1)
    torch.testing.assert_close(got, want, atol=0.02, rtol=0)


# 71 s on CI's slower host: tox -e test-long runs it; the critic cut like the policy is
# rlinf-workers' tests/actor/megatron (TP+SP, PP, DP with the distributed optimizer), in CI.
@pytest.mark.long
def test_ppo_trains_with_its_critic_cut_like_the_policy(tmp_path: Path,
                                                      ray_address: str) -> None:
    """PPO on a tensor-parallel cut with sequence parallelism: the critic is a second stage
    of the cut (its numbers against one process are rlinf-workers' tests/actor/megatron);
    through the app it trains, learns values and checkpoints."""
    run_cli(tmp_path, *MEGATRON, "algorithm=ppo", "placement=collocated",
            "cluster.cpu_slots=2", "actor.tensor_parallel=2", "actor.sequence_parallel=true",
            "run.predict=false", ray_address=ray_address)
    trained = [m["actor/value_loss"] for m in _metrics(tmp_path) if "actor/value_loss" in m]
    assert len(trained) == 2, _metrics(tmp_path)
    assert all(loss > 0 and math.isfinite(loss) for loss in trained)
    last = sorted((tmp_path / "checkpoints").glob("step-*"))[-1] / "actor"
    for rank in range(2):
        saved = torch.load(last / f"rank{rank}.pt", weights_only=False)["model"]
        assert any(name.startswith("critic.") for name in saved)


@pytest.mark.parametrize(("overrides", "message"), [
    (("placement=hybrid", "cluster.cpu_slots=2", "actor.tensor_parallel=2"),
     "divides the actor's 1 device"),
    (("placement=collocated", "actor.backend=ddp", "actor.pipeline_parallel=2"),
     "1 unless actor.backend=megatron"),
    (("placement=collocated", "actor.sequence_parallel=true"),
     "false unless actor.tensor_parallel > 1"),
    (("placement=collocated", "actor.backend=fsdp2", "actor.distributed_optimizer=true"),
     "false unless actor.backend=megatron"),
    (("placement=collocated", "actor.cut=auto"), "fixed unless placement=auto"),
    (("placement=auto", "actor.backend=ddp", "actor.cut=auto"),
     "fixed unless actor.backend=megatron"),
    (("placement=auto", "actor.cut=auto", "actor.tensor_parallel=2"),
     "its default with actor.cut=auto"),
    (("placement=auto", "actor.cut=auto", "actor.sequence_parallel=true"),
     "its default with actor.cut=auto"),
])
def test_bad_cuts_fail_before_any_worker_starts(tmp_path: Path, overrides: tuple[str, ...],
                                                message: str) -> None:
    proc = subprocess.run(cli_command(tmp_path, *MEGATRON, *overrides), capture_output=True,
                          text=True, timeout=120, env=cli_env(), check=False)
    assert proc.returncode == 2, proc.stderr[-2000:]
    assert message in proc.stdout + proc.stderr
    assert "Traceback" not in proc.stderr
