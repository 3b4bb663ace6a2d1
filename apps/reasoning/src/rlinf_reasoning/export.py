"""``rlinf-reasoning export RUN_DIR [--step N] --out DIR``: a run's checkpoint as a Hugging
Face folder that transformers, vLLM and SGLang load (`rlinf.workers.actor.hf_export`: a
LoRA run's adapter in PEFT's layout, or with ``--merge`` the model with it merged in).
The run's starting model is rebuilt from the config the checkpoint recorded.
"""

from __future__ import annotations

from pathlib import Path

from rlinf.workers.errors import ConfigError
from rlinf.workers.schema import build, nested
from rlinf.workers.training.folder import EXPORT_FILE, checkpoint_for_export, write_export_record
from rlinf_reasoning.config import ReasoningConfig, config_hash
from rlinf_reasoning.errors import ExportError
from rlinf_reasoning.spec import flow_spec

__all__ = ["EXPORT_FILE", "export_checkpoint"]


def export_checkpoint(run_dir: Path, out: Path, *, step: int | None = None,
                      merge: bool = False) -> Path:
    """Write the policy of `run_dir`'s checkpoint at `step` (None: the latest) to `out` as a
    Hugging Face folder; returns `out` (module docstring)."""
    from rlinf.workers.actor.hf_export import save_hf_policy  # torch, transformers

    if out.exists() and any(out.iterdir()) and not (out / EXPORT_FILE).is_file():
        raise ExportError(f"{out} is not empty and holds no earlier export ({EXPORT_FILE}): "
                          "pass a new or empty --out folder, so nothing in it is overwritten")
    try:
        found_step, folder, meta = checkpoint_for_export(run_dir, step)
        spec = flow_spec(build(ReasoningConfig, nested(meta["config"])))
        save_hf_policy(folder / "actor", out, source=spec.model, lora=spec.actor.lora,
                       merge=merge)
    except ConfigError as exc:
        raise ExportError(str(exc)) from exc
    write_export_record(out, run_dir=run_dir, step=found_step,
                        config_hash=config_hash(meta["config"]))
    return out
