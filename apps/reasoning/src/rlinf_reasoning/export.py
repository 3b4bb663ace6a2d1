"""``rlinf-reasoning export RUN_DIR [--step N] --out DIR``: a run's checkpoint as a Hugging
Face folder (safetensors weights, config, tokenizer) that transformers, vLLM and SGLang load.

The run's own checkpoint is torch pickles of every actor rank (model, optimizer, RNG); the
export rebuilds the run's starting model from the config the checkpoint recorded (so the
architecture and tokenizer are the run's), loads rank 0's policy weights into it (complete
tensors: DDP and FSDP2 checkpoints are written unsharded; a Megatron actor's shards are
reassembled from every rank's file) and saves it with ``save_pretrained``. The
critic of a PPO run is not exported: it is no model a server loads. A LoRA run exports its
adapter in PEFT's layout, or with ``--merge`` the model with the adapter merged in.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import torch

from rlinf.workers.actor.lora import ADAPTER, apply_lora, is_lora_model
from rlinf.workers.actor.megatron import hf_policy_from_checkpoint
from rlinf.workers.schema import build, nested
from rlinf.workers.telemetry import CheckpointStore
from rlinf.workers.telemetry.checkpoints import META_FILE
from rlinf.workers.training import CHECKPOINT_DIR
from rlinf_reasoning.config import ReasoningConfig, config_hash
from rlinf_reasoning.errors import ExportError
from rlinf_reasoning.hub import resolve_model_dir
from rlinf_reasoning.models import model_factory
from rlinf_reasoning.spec import flow_spec

__all__ = ["EXPORT_FILE", "export_checkpoint"]

EXPORT_FILE = "rlinf_export.json"
"""Written beside the model: which run and step it came from."""

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


def export_checkpoint(run_dir: Path, out: Path, *, step: int | None = None,
                      merge: bool = False) -> Path:
    """Write the policy of `run_dir`'s checkpoint at `step` (None: the latest) to `out` as a
    Hugging Face folder; returns `out` (module docstring). A LoRA run's adapter is written
    in PEFT's layout (`_export_adapter`), or with `merge` merged into a plain model."""
    if out.exists() and any(out.iterdir()) and not (out / EXPORT_FILE).is_file():
        raise ExportError(f"{out} is not empty and holds no earlier export ({EXPORT_FILE}): "
                          "pass a new or empty --out folder, so nothing in it is overwritten")
    found_step, folder, meta = _checkpoint(run_dir, step)
    cfg = build(ReasoningConfig, nested(meta["config"]))
    spec = flow_spec(cfg)
    model, tokenizer = model_factory(spec)()
    policy = hf_policy_from_checkpoint(folder / "actor")
    if spec.actor.lora is not None:
        model = apply_lora(model, spec.actor.lora)
    missing, unexpected = model.load_state_dict(policy, strict=False)
    if unexpected or [k for k in missing if k not in _tied(model)]:
        raise ExportError(f"{folder / 'actor'} does not match the run's model: missing "
                          f"{missing[:5]}, unexpected {unexpected[:5]}")
    out.mkdir(parents=True, exist_ok=True)
    if is_lora_model(model) and not merge:
        _export_adapter(model, cfg, out)
    else:
        if is_lora_model(model):
            model = model.merge_and_unload()  # type: ignore[operator]
        model.save_pretrained(out, safe_serialization=True)  # type: ignore[operator]
    tokenizer.save_pretrained(out)
    (out / EXPORT_FILE).write_text(json.dumps(
        {"run_dir": str(run_dir), "step": found_step, "config_hash": config_hash(meta["config"])},
        indent=2) + "\n")
    return out


BASE_DIR = "base"
"""Where an adapter export writes its base model when the run started from no Hugging Face
folder (the warm start, a model from config)."""


def _export_adapter(model: torch.nn.Module, cfg: ReasoningConfig, out: Path) -> None:
    """The adapter in PEFT's layout (``adapter_config.json``, ``adapter_model.safetensors``)
    whose ``base_model_name_or_path`` is the run's ``model.dir``, or the base model written
    beside it (`BASE_DIR`), so ``AutoPeftModelForCausalLM.from_pretrained(out)`` loads it."""
    base_dir = (Path(resolve_model_dir(cfg.model.dir)) if cfg.model.dir is not None
                and (Path(resolve_model_dir(cfg.model.dir)) / "config.json").is_file()
                else None)
    if base_dir is None:
        base_dir = out / BASE_DIR
        model.get_base_model().save_pretrained(  # type: ignore[operator]
            base_dir, safe_serialization=True,
            state_dict={k.replace(".base_layer.", "."): v for k, v in
                        model.get_base_model().state_dict().items()  # type: ignore[operator]
                        if ".lora_" not in k})
    peft_config: Any = model.peft_config[ADAPTER]  # type: ignore[index]
    peft_config.base_model_name_or_path = str(base_dir.resolve())
    model.save_pretrained(out, safe_serialization=True)  # type: ignore[operator]


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
