"""A warm-start folder: a tiny Qwen2-style model with the task it was trained on.

The reasoning app ships two (its ``scripts/train_warmstart.py`` writes them); a folder holds

- ``warmstart.json``: the `TinyLMConfig` the model is built from, the `GeneratorConfig`
  of the task it was trained on, the training settings and the accuracy it reached;
- ``model.safetensors``: the weights (fp32);
- ``tokenizer.json`` + ``tokenizer_config.json``: the char tokenizer.

`load_warmstart` builds the model from its config (`build_tiny_causal_lm`, no download) and
loads the weights into it, so the model and the stored one are the same architecture.
"""

from __future__ import annotations

import json
import math
from dataclasses import fields
from pathlib import Path
from typing import TYPE_CHECKING, Any

import structlog
import torch
from safetensors.torch import load_file

from rlinf.envs.math import GeneratorConfig
from rlinf.workers.errors import WorkersError
from rlinf.workers.models.lm_config import TinyLMConfig
from rlinf.workers.models.tokenizer import load_tokenizer

if TYPE_CHECKING:
    from transformers import PreTrainedModel, PreTrainedTokenizerFast

__all__ = [
    "METADATA_FILE",
    "WEIGHTS_FILE",
    "WarmstartError",
    "load_warmstart",
    "read_metadata",
    "stored_parameters",
    "warmstart_task",
]

_log = structlog.get_logger(__name__)

METADATA_FILE = "warmstart.json"
"""Model config, task config, training settings and measured accuracy."""
WEIGHTS_FILE = "model.safetensors"
"""The model's state dict."""


class WarmstartError(WorkersError, RuntimeError):
    """The warm-start checkpoint is missing or does not match its config."""


def read_metadata(path: Path) -> dict[str, Any]:
    """The contents of ``warmstart.json`` in `path`."""
    meta_path = path / METADATA_FILE
    if not meta_path.is_file():
        raise WarmstartError(
            f"no {METADATA_FILE} in {path}: not a warm-start folder (the reasoning app's "
            "scripts/train_warmstart.py writes one)"
        )
    meta: dict[str, Any] = json.loads(meta_path.read_text())
    return meta


def _dataclass_from(cls: type[Any], values: dict[str, Any]) -> Any:
    known = {f.name for f in fields(cls)}
    unknown = set(values) - known
    if unknown:
        raise WarmstartError(f"{cls.__name__} has no fields {sorted(unknown)}; "
                             f"expected a subset of {sorted(known)}")
    # JSON turns tuples into lists; the configs are frozen and hashable with tuples.
    return cls(**{k: tuple(v) if isinstance(v, list) else v for k, v in values.items()})


def warmstart_task(path: Path) -> GeneratorConfig:
    """The generator config of the task the checkpoint was trained on (seed included)."""
    config: GeneratorConfig = _dataclass_from(GeneratorConfig, read_metadata(path)["task"])
    return config


def stored_parameters(path: Path) -> tuple[int, str]:
    """The parameter count and dtype of the checkpoint's weights, read from the weights file
    without building the model: what `load_warmstart`'s model counts (the tied output head
    is not stored and not counted twice)."""
    from safetensors import safe_open

    _weights_file(path)
    count, dtypes = 0, set()
    with safe_open(str(path / WEIGHTS_FILE), framework="pt") as weights:
        for name in weights.keys():  # noqa: SIM118  # safe_open is not a mapping
            tensor = weights.get_slice(name)
            count += math.prod(tensor.get_shape())
            dtypes.add(tensor.get_dtype())
    if len(dtypes) != 1:
        raise WarmstartError(f"{path / WEIGHTS_FILE} mixes dtypes {sorted(dtypes)}")
    return count, _SAFETENSORS_DTYPES.get(dtypes.pop(), "unknown")


def _weights_file(path: Path) -> Path:
    weights = path / WEIGHTS_FILE
    if not weights.is_file():
        raise WarmstartError(f"{path} has {METADATA_FILE} but no {WEIGHTS_FILE}: the warm start "
                             "was not written completely; write it again")
    return weights


_SAFETENSORS_DTYPES = {"F32": "float32", "F16": "float16", "BF16": "bfloat16", "F64": "float64"}
"""safetensors' dtype codes as torch names them."""


def load_warmstart(
    path: Path, device: str | torch.device = "cpu"
) -> tuple[PreTrainedModel, PreTrainedTokenizerFast]:
    """The model of the warm-start folder `path` (in eval mode, on `device`) and its
    tokenizer.

    The model is built from the stored `TinyLMConfig` and the weights are loaded strictly:
    a checkpoint that does not match its config raises `WarmstartError`.
    """
    from rlinf.workers.models.causal_lm import build_tiny_causal_lm  # transformers' modeling

    meta = read_metadata(path)
    model_config: TinyLMConfig = _dataclass_from(TinyLMConfig, meta["model"])
    tokenizer = load_tokenizer(path)
    model = build_tiny_causal_lm(model_config, seed=0, tokenizer=tokenizer)
    state = load_file(str(_weights_file(path)))
    # Tied embeddings: the output head shares the input embedding and is not stored.
    missing, unexpected = model.load_state_dict(state, strict=False)
    tied = {"lm_head.weight"} if model_config.tie_word_embeddings else set()
    if set(missing) - tied or unexpected:
        raise WarmstartError(
            f"checkpoint in {path} does not match {model_config}: missing {sorted(missing)}, "
            f"unexpected {sorted(unexpected)}"
        )
    model.tie_weights()
    model.to(device)  # type: ignore[arg-type]  # transformers' `to` wrapper is mistyped
    model.eval()
    _log.debug("warmstart_loaded", path=str(path), device=str(device),
               params=sum(p.numel() for p in model.parameters()))
    return model, tokenizer
