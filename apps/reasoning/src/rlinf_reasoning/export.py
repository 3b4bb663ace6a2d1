"""``rlinf-reasoning export RUN_DIR [--step N] --out DIR``: a run's checkpoint as a Hugging
Face folder (safetensors weights, config, tokenizer) that transformers, vLLM and SGLang load.

The run's own checkpoint is torch pickles of every actor rank (model, optimizer, RNG); the
export rebuilds the run's starting model from the config the checkpoint recorded (so the
architecture and tokenizer are the run's), loads rank 0's policy weights into it (complete
tensors: DDP and FSDP2 checkpoints are written unsharded; a Megatron actor's shards are
reassembled from every rank's file) and saves it with ``save_pretrained``. The
critic of a PPO run is not exported: it is no model a server loads.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import torch

from rlinf.workers.actor.megatron import hf_policy_from_checkpoint
from rlinf.workers.telemetry import CheckpointStore
from rlinf.workers.telemetry.checkpoints import META_FILE
from rlinf_reasoning._schema import build
from rlinf_reasoning.config import ReasoningConfig
from rlinf_reasoning.errors import ExportError
from rlinf_reasoning.models import model_factory
from rlinf_reasoning.resume import CHECKPOINT_DIR
from rlinf_reasoning.spec import flow_spec

__all__ = ["EXPORT_FILE", "export_checkpoint"]

EXPORT_FILE = "rlinf_export.json"
"""Written beside the model: which run and step it came from."""

def _nested(flat: Mapping[str, Any]) -> dict[str, Any]:
    """``{"a.b": v}`` → ``{"a": {"b": v}}`` (the config sections of `config_dict`)."""
    out: dict[str, Any] = {}
    for key, value in flat.items():
        head, dot, rest = key.partition(".")
        if dot:
            out.setdefault(head, {})[rest] = value
        else:
            out[key] = value
    return out


def _checkpoint(run_dir: Path, step: int | None) -> tuple[int, Path, dict[str, Any]]:
    store_root = run_dir / CHECKPOINT_DIR
    if not store_root.is_dir():
        raise ExportError(f"{run_dir} holds no checkpoints (no {CHECKPOINT_DIR}/): pass the "
                          "--run-dir of a run that saved one (run.checkpoint_every)")
    store = CheckpointStore(store_root)
    steps = store.steps()
    if not steps:
        raise ExportError(f"{store_root} holds no complete checkpoint")
    chosen = steps[-1] if step is None else next((s for s in steps if s[0] == step), None)
    if chosen is None:
        raise ExportError(f"{store_root} has no checkpoint of step {step}; it has steps "
                          f"{[s for s, _ in steps]}")
    meta = json.loads((chosen[1] / META_FILE).read_text(encoding="utf-8"))
    return chosen[0], chosen[1], meta


def export_checkpoint(run_dir: Path, out: Path, *, step: int | None = None) -> Path:
    """Write the policy of `run_dir`'s checkpoint at `step` (None: the latest) to `out` as a
    Hugging Face folder; returns `out` (module docstring)."""
    if out.exists() and any(out.iterdir()) and not (out / EXPORT_FILE).is_file():
        raise ExportError(f"{out} is not empty and holds no earlier export ({EXPORT_FILE}): "
                          "pass a new or empty --out folder, so nothing in it is overwritten")
    found_step, folder, meta = _checkpoint(run_dir, step)
    cfg = build(ReasoningConfig, _nested(meta["config"]))
    model, tokenizer = model_factory(flow_spec(cfg))()
    policy = hf_policy_from_checkpoint(folder / "actor")
    missing, unexpected = model.load_state_dict(policy, strict=False)
    if unexpected or [k for k in missing if k not in _tied(model)]:
        raise ExportError(f"{folder / 'actor'} does not match the run's model: missing "
                          f"{missing[:5]}, unexpected {unexpected[:5]}")
    out.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(out, safe_serialization=True)  # type: ignore[operator]
    tokenizer.save_pretrained(out)
    (out / EXPORT_FILE).write_text(json.dumps(
        {"run_dir": str(run_dir), "step": found_step, "config_hash": meta.get("config_hash")},
        indent=2) + "\n")
    return out


def _tied(model: torch.nn.Module) -> set[str]:
    """Parameter names that share storage with another (tied embeddings): a state dict may
    carry one name of each pair."""
    seen: dict[int, str] = {}
    tied: set[str] = set()
    for name, tensor in model.state_dict(keep_vars=True).items():
        key = tensor.data_ptr()
        if key in seen:
            tied |= {name, seen[key]}
        else:
            seen[key] = name
    return tied
