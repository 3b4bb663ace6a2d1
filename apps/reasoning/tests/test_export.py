"""``rlinf-reasoning export``: a checkpoint becomes a Hugging Face folder that transformers
loads to the same log-probs."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from rlinf_reasoning.cli import main
from rlinf_reasoning.config import ReasoningConfig, config_dict, config_hash
from rlinf_reasoning.export import EXPORT_FILE, export_checkpoint
from rlinf_reasoning.spec import flow_spec
from torch import nn

from rlinf.workers.actor import checkpoint as actor_checkpoint
from rlinf.workers.telemetry import CheckpointStore
from rlinf.workers.training import CHECKPOINT_DIR


def _run_with_checkpoints(run_dir: Path, steps: tuple[int, ...]) -> dict[int, nn.Module]:
    """A run folder as `rlinf-reasoning` leaves it: the default config's model, trained
    (here: perturbed) and checkpointed after each of `steps`, as the actor's rank 0 writes
    it (policy and optimizer of `PolicyTrainer._modules()`)."""
    cfg = ReasoningConfig()
    model, _ = flow_spec(cfg).model.model_factory()()
    store = CheckpointStore(run_dir / CHECKPOINT_DIR, keep=len(steps))
    saved = {}
    gen = torch.Generator().manual_seed(0)
    for step in steps:
        with torch.no_grad():
            for p in model.parameters():
                p.add_(0.05 * torch.randn(p.shape, generator=gen))
        modules = nn.ModuleDict({"policy": model})
        optimizer = torch.optim.AdamW(modules.parameters())
        store.save(step, lambda d, m=modules, o=optimizer, s=step: actor_checkpoint.save(
            d / "actor", modules=m, optimizer=o, step=s),
            meta={"step": step, "config": config_dict(cfg), "config_hash": config_hash(cfg)})
        saved[step] = {k: v.clone() for k, v in model.state_dict().items()}
    return saved


def _log_probs(model: nn.Module, ids: torch.Tensor) -> torch.Tensor:
    logits = model(input_ids=ids).logits.float()
    return torch.log_softmax(logits[:, :-1], dim=-1).gather(-1, ids[:, 1:, None])[..., 0]


def test_export_loads_in_transformers_to_the_same_log_probs(tmp_path: Path) -> None:
    from transformers import AutoModelForCausalLM, AutoTokenizer

    saved = _run_with_checkpoints(tmp_path / "run", steps=(10, 20))
    out = export_checkpoint(tmp_path / "run", tmp_path / "hf", step=10)
    assert (out / "model.safetensors").is_file() and (out / "config.json").is_file()
    assert json.loads((out / EXPORT_FILE).read_text())["step"] == 10
    exported = AutoModelForCausalLM.from_pretrained(out).eval()
    tokenizer = AutoTokenizer.from_pretrained(out)
    reference, _ = flow_spec(ReasoningConfig()).model.model_factory()()
    reference.load_state_dict(saved[10])
    ids = torch.tensor([tokenizer.encode("12+7=19")])
    with torch.no_grad():
        torch.testing.assert_close(_log_probs(exported, ids), _log_probs(reference.eval(), ids))
    # Not the other checkpoint's weights, and not the starting ones.
    assert not torch.equal(next(exported.parameters()),
                           next(iter(saved[20].values())))


def test_the_cli_exports_the_latest_and_refuses_a_missing_step(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    _run_with_checkpoints(tmp_path / "run", steps=(5, 7))
    assert main(["export", str(tmp_path / "run"), "--out", str(tmp_path / "hf")]) == 0
    assert json.loads((tmp_path / "hf" / EXPORT_FILE).read_text())["step"] == 7
    assert main(["export", str(tmp_path / "run"), "--step", "6", "--out",
                 str(tmp_path / "x")]) == 2
    assert "has no checkpoint of step 6; it has steps [5, 7]" in capsys.readouterr().err
    assert main(["export", str(tmp_path / "nothing"), "--out", str(tmp_path / "y")]) == 2
    # A folder with other files is not overwritten; an earlier export may be.
    (tmp_path / "mine").mkdir()
    (tmp_path / "mine" / "notes.txt").write_text("keep")
    assert main(["export", str(tmp_path / "run"), "--out", str(tmp_path / "mine")]) == 2
    assert "is not empty" in capsys.readouterr().err
    assert (tmp_path / "mine" / "notes.txt").read_text() == "keep"
    assert main(["export", str(tmp_path / "run"), "--step", "5", "--out",
                 str(tmp_path / "hf")]) == 0
