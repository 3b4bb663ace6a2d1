"""A trained policy as a Hugging Face folder (safetensors weights, config, tokenizer) that
transformers, vLLM and SGLang load: `save_hf_policy`.

An actor's checkpoint is torch pickles of every rank (model, optimizer, RNG). The export
rebuilds the starting model from its `ModelSource` (so the architecture and tokenizer are
the run's), loads rank 0's policy weights into it (complete tensors: DDP and FSDP2
checkpoints are written unsharded; a Megatron actor's shards are reassembled from every
rank's file) and saves it with ``save_pretrained``. A PPO critic is not exported: it is no
model a server loads. A LoRA policy is written as its adapter in PEFT's layout, or with
``merge`` as the model with the adapter merged in.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from torch import nn

from rlinf.workers.actor.lora import ADAPTER, LoraConfig, apply_lora, is_lora_model
from rlinf.workers.actor.megatron import hf_policy_from_checkpoint
from rlinf.workers.errors import ConfigError
from rlinf.workers.models.sources import ModelSource

__all__ = ["BASE_DIR", "save_hf_policy", "tied_names"]

BASE_DIR = "base"
"""Where an adapter export writes its base model when the source is no Hugging Face folder
(a warm start, a tiny model from config)."""


def save_hf_policy(actor_dir: Path, out: Path, *, source: ModelSource,
                   lora: LoraConfig | None = None, merge: bool = False) -> None:
    """Write the policy of the actor checkpoint `actor_dir` to `out` (module docstring);
    a `ConfigError` when the checkpoint does not fit `source`'s model."""
    model, tokenizer = source.model_factory()()
    if lora is not None:
        model = apply_lora(model, lora)
    missing, unexpected = model.load_state_dict(hf_policy_from_checkpoint(actor_dir),
                                                strict=False)
    if unexpected or [k for k in missing if k not in tied_names(model)]:
        raise ConfigError(f"{actor_dir} does not match the run's model: missing "
                          f"{missing[:5]}, unexpected {unexpected[:5]}")
    out.mkdir(parents=True, exist_ok=True)
    if is_lora_model(model) and not merge:
        _save_adapter(model, source, out)
    else:
        if is_lora_model(model):
            model = model.merge_and_unload()  # type: ignore[operator]
        model.save_pretrained(out, safe_serialization=True)  # type: ignore[operator]
    tokenizer.save_pretrained(out)


def _save_adapter(model: nn.Module, source: ModelSource, out: Path) -> None:
    """The adapter in PEFT's layout (``adapter_config.json``, ``adapter_model.safetensors``)
    whose ``base_model_name_or_path`` is the source's Hugging Face folder, or the base model
    written beside it (`BASE_DIR`), so ``AutoPeftModelForCausalLM.from_pretrained(out)``
    loads it."""
    base_dir = source.dir if source.is_hf_folder and source.dir is not None else None
    if base_dir is None:
        base_dir = out / BASE_DIR
        base: Any = model.get_base_model()  # type: ignore[operator]
        base.save_pretrained(base_dir, safe_serialization=True, state_dict={
            k.replace(".base_layer.", "."): v for k, v in base.state_dict().items()
            if ".lora_" not in k})
    peft_config: Any = model.peft_config[ADAPTER]  # type: ignore[index]
    peft_config.base_model_name_or_path = str(Path(base_dir).resolve())
    model.save_pretrained(out, safe_serialization=True)  # type: ignore[operator]


def tied_names(model: nn.Module) -> set[str]:
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
