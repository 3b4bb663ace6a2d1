"""Where the flow's policy comes from: a warm-start folder, a Hugging Face folder, or a tiny
model built from config, as a picklable factory every role calls in its own process.

The factories are module-level functions wrapped in `functools.partial`, so Ray pickles
them by reference and each rank builds identical weights. Importing this module (which
every role's process does, to unpickle them) leaves transformers' modeling code out: a
role that only needs the tokenizer (`tokenizer_factory`) never imports it.
"""

from __future__ import annotations

import functools
import tempfile
from pathlib import Path
from typing import TYPE_CHECKING

import torch
from torch import nn

from rlinf.workers.errors import ConfigError
from rlinf.workers.models.tokenizer import build_char_tokenizer, load_tokenizer
from rlinf_reasoning.spec import FlowSpec
from rlinf_reasoning.warmstart import METADATA_FILE, load_warmstart

if TYPE_CHECKING:
    from transformers import PreTrainedTokenizerBase

    from rlinf.workers.reasoning import ModelFactory, TokenizerFactory

__all__ = ["export_for_engine", "hf_model_on_meta", "load_model_dir", "load_tokenizer_dir",
           "model_factory", "policy_structure", "tokenizer_factory"]


def _is_warm_start(folder: Path) -> bool:
    """Whether `folder` is a warm start (True) or a Hugging Face checkpoint (False); a
    folder that is neither is refused."""
    if (folder / METADATA_FILE).is_file():
        return True
    if not (folder / "config.json").is_file():
        raise ConfigError(f"{folder} holds neither {METADATA_FILE} (a warm start) nor "
                          "config.json (a Hugging Face checkpoint)")
    return False


def load_model_dir(path: str) -> tuple[nn.Module, PreTrainedTokenizerBase]:
    """The model and tokenizer in `path`: a warm-start folder or a Hugging Face one."""
    folder = Path(path)
    if _is_warm_start(folder):
        model, tokenizer = load_warmstart(path=folder)
        return model, tokenizer
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(folder, local_files_only=True)
    return model, load_tokenizer_dir(path)


def load_tokenizer_dir(path: str) -> PreTrainedTokenizerBase:
    """The tokenizer in `path` (a warm-start folder or a Hugging Face one), without the
    model: what `load_model_dir` returns beside it."""
    folder = Path(path)
    if _is_warm_start(folder):
        return load_tokenizer(folder)
    from transformers import AutoTokenizer

    tokenizer: PreTrainedTokenizerBase = AutoTokenizer.from_pretrained(folder,
                                                                       local_files_only=True)
    return tokenizer


def hf_model_on_meta(folder: Path) -> tuple[nn.Module, PreTrainedTokenizerBase, str]:
    """The model of a Hugging Face `folder` on the meta device (shapes, no weights read),
    its tokenizer and the dtype its weights are stored in."""
    from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer

    config = AutoConfig.from_pretrained(folder, local_files_only=True)
    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(config)
    stored = getattr(config, "torch_dtype", None) or getattr(config, "dtype", None)
    return (model, AutoTokenizer.from_pretrained(folder, local_files_only=True),
            str(stored).removeprefix("torch.") if stored is not None else "float32")


def policy_structure(spec: FlowSpec) -> nn.Module:
    """`spec`'s policy for its shapes only: on the meta device for a Hugging Face folder
    (no weights read), built otherwise (a tiny model or a warm start, both small)."""
    folder = Path(spec.model_dir)
    if spec.model_config is None and not (folder / METADATA_FILE).is_file():
        return hf_model_on_meta(folder)[0]
    return model_factory(spec)()[0]


def model_factory(spec: FlowSpec) -> ModelFactory:
    """The factory of `spec`'s initial policy: a tiny model of `spec.model_config`, or the
    folder `spec.model_dir`."""
    if spec.model_config is not None:
        from rlinf.workers.models.causal_lm import build_tiny_model

        return functools.partial(build_tiny_model, spec.model_config, seed=spec.model_seed)
    return functools.partial(load_model_dir, str(spec.model_dir))


def tokenizer_factory(spec: FlowSpec) -> TokenizerFactory:
    """The factory of `spec`'s tokenizer alone (`model_factory`'s, without the model)."""
    if spec.model_config is not None:
        return build_char_tokenizer  # build_tiny_model's tokenizer
    return functools.partial(load_tokenizer_dir, str(spec.model_dir))


def export_for_engine(spec: FlowSpec) -> tuple[str | None, tempfile.TemporaryDirectory[str] | None]:
    """The Hugging Face folder the rollout engine loads (vLLM and SGLang read a folder;
    HF ``generate`` takes the factory's model: None), and the temporary folder exported for
    it when the model is not in one already (the caller removes it when the flow closes)."""
    if spec.engine == "hf":
        return None, None
    if spec.model_config is None and (Path(spec.model_dir) / "config.json").is_file():
        return str(spec.model_dir), None
    folder = tempfile.TemporaryDirectory(prefix="rlinf-flow-model-")
    model, tokenizer = model_factory(spec)()
    model.save_pretrained(folder.name)  # type: ignore[operator]
    tokenizer.save_pretrained(folder.name)
    return folder.name, folder
