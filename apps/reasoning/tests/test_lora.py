"""A LoRA run through the CLI: 3 steps with adapters on the policy, then ``export`` in PEFT's
layout (loaded with PEFT) and ``--merge`` (loaded with plain transformers), both giving the
logits of the trained model."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
import torch

from .test_run import read_jsonl, run_cli

pytestmark = pytest.mark.timeout(900)
peft = pytest.importorskip("peft", reason="the lora extra")


def _export(run: Path, out: Path, *flags: str) -> None:
    proc = subprocess.run([sys.executable, "-m", "rlinf_reasoning.cli", "export", str(run),
                           "--out", str(out), *flags], capture_output=True, text=True,
                          timeout=300, check=False)
    assert proc.returncode == 0, proc.stderr[-2000:]


def _trained_logits(run: Path, ids: torch.Tensor) -> torch.Tensor:
    """The checkpointed policy, rebuilt as the run built it: adapters on the start model."""
    import json

    from rlinf_reasoning.config import ReasoningConfig
    from rlinf_reasoning.spec import flow_spec

    from rlinf.workers.actor.lora import apply_lora
    from rlinf.workers.actor.megatron import hf_policy_from_checkpoint
    from rlinf.workers.schema import build
    from rlinf.workers.schema import nested as _nested
    from rlinf.workers.telemetry import CheckpointStore
    from rlinf.workers.telemetry.checkpoints import META_FILE

    (_, folder), = CheckpointStore(run / "checkpoints").steps()[-1:]
    cfg = build(ReasoningConfig, _nested(json.loads((folder / META_FILE).read_text())["config"]))
    spec = flow_spec(cfg)
    assert spec.actor.lora is not None and spec.actor.lora.rank == 4
    model = apply_lora(spec.model.model_factory()()[0], spec.actor.lora)
    model.load_state_dict(hf_policy_from_checkpoint(folder / "actor"))
    with torch.no_grad():
        return model(input_ids=ids).logits


def test_a_lora_run_trains_exports_and_loads_with_peft_and_merged(
        tmp_path: Path, ray_address: str) -> None:
    from transformers import AutoModelForCausalLM

    run = tmp_path / "run"
    run_cli(run, "run.steps=3", "actor.lora.rank=4", "algorithm.lr=0.01",
            "placement=collocated", "run.predict=false", ray_address=ray_address)
    records = [r for r in read_jsonl(run / "metrics.jsonl") if "actor/grad_norm" in r]
    assert len(records) == 3 and any(r["actor/grad_norm"] > 0 for r in records)
    # The sync sent the adapters only (the HF rollout merges them): measured at export.
    from rlinf_reasoning.warmstart import load_warmstart

    full = sum(p.numel() * p.element_size() for p in load_warmstart()[0].parameters())
    assert all(0 < r["weight_sync/bytes"] < 0.10 * full for r in records)
    _export(run, tmp_path / "adapter")
    _export(run, tmp_path / "merged", "--merge")
    assert (tmp_path / "adapter" / "adapter_config.json").is_file()
    assert (tmp_path / "adapter" / "adapter_model.safetensors").is_file()
    assert not (tmp_path / "merged" / "adapter_config.json").exists()

    ids = torch.tensor([[1, 5, 9, 14, 3, 7, 2, 11]])
    trained = _trained_logits(run, ids)
    with torch.no_grad():
        adapted = peft.AutoPeftModelForCausalLM.from_pretrained(tmp_path / "adapter")
        merged = AutoModelForCausalLM.from_pretrained(tmp_path / "merged")
        torch.testing.assert_close(adapted(input_ids=ids).logits, trained, rtol=1e-4,
                                   atol=1e-5)
        # Merged weights fold B A into W: float32 rounds them differently than the adapter's
        # separate matmuls, by up to a few 1e-5 on a logit.
        torch.testing.assert_close(merged(input_ids=ids).logits, trained, rtol=1e-4, atol=1e-4)
    base = AutoModelForCausalLM.from_pretrained(tmp_path / "adapter" / "base")
    with torch.no_grad():
        assert not torch.allclose(base(input_ids=ids).logits, trained, atol=1e-5)  # it trained
