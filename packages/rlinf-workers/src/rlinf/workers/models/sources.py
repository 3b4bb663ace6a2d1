"""Where a policy comes from: `ModelSource`, a Hugging Face folder, a warm-start folder
(`rlinf.workers.models.warmstart`) or a tiny model built from its `TinyLMConfig`.

A source hands each role picklable factories: module-level functions wrapped in
`functools.partial`, so Ray pickles them by reference and each rank builds identical
weights. Importing this module (which every role's process does, to unpickle them) leaves
transformers' modeling code out: a role that only needs the tokenizer
(`ModelSource.tokenizer_factory`) never imports it.
"""

from __future__ import annotations

import contextlib
import functools
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import torch
from torch import nn

from rlinf.workers.errors import ConfigError
from rlinf.workers.models.lm_config import TinyLMConfig
from rlinf.workers.models.tokenizer import build_char_tokenizer, load_tokenizer
from rlinf.workers.models.warmstart import METADATA_FILE, load_warmstart, stored_parameters

if TYPE_CHECKING:
    from transformers import PreTrainedTokenizerBase

    from rlinf.workers.reasoning import ModelFactory, TokenizerFactory

__all__ = ["ModelSource", "SourceFacts", "hf_model_on_meta", "load_model_dir",
           "load_tokenizer_dir"]


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
        model, tokenizer = load_warmstart(folder)
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


@dataclass(frozen=True)
class SourceFacts:
    """What a source holds, counted without reading a Hugging Face folder's weights."""

    where: str
    """The folder, "warm start <folder>", or "tiny model from config"."""
    parameters: int
    stored_dtype: str
    """The weights' dtype as stored (the Hugging Face config's, or the built model's)."""
    tokenizer: PreTrainedTokenizerBase


@dataclass(frozen=True)
class ModelSource:
    """The initial policy: the tiny model of `config` when set, else the folder `dir`."""

    dir: Path | None = None
    """A Hugging Face folder (``config.json``) or a warm-start folder (``warmstart.json``)."""
    config: TinyLMConfig | None = None
    """Build a fresh tiny model from this config (with the char tokenizer) instead."""
    seed: int = 0
    """Seed of the tiny model built from `config`."""

    def __post_init__(self) -> None:
        if (self.dir is None) == (self.config is None):
            raise ConfigError("a ModelSource takes a folder (dir) or a tiny model's config, "
                              f"exactly one; got dir={self.dir}, config={self.config}")

    @property
    def is_hf_folder(self) -> bool:
        """Whether the source is a Hugging Face folder (weights engines load as they are)."""
        return self.dir is not None and (self.dir / "config.json").is_file() \
            and not (self.dir / METADATA_FILE).is_file()

    def model_factory(self) -> ModelFactory:
        """The picklable factory of the model and its tokenizer."""
        if self.config is not None:
            from rlinf.workers.models.causal_lm import build_tiny_model

            return functools.partial(build_tiny_model, self.config, seed=self.seed)
        return functools.partial(load_model_dir, str(self.dir))

    def tokenizer_factory(self) -> TokenizerFactory:
        """The picklable factory of the tokenizer alone (`model_factory`'s, no model)."""
        if self.config is not None:
            return build_char_tokenizer  # build_tiny_model's tokenizer
        return functools.partial(load_tokenizer_dir, str(self.dir))

    def structure(self) -> nn.Module:
        """The model for its shapes only: on the meta device for a Hugging Face folder (no
        weights read), built otherwise (a tiny model or a warm start, both small)."""
        if self.is_hf_folder:
            assert self.dir is not None
            return hf_model_on_meta(self.dir)[0]
        return self.model_factory()()[0]

    def facts(self) -> SourceFacts:
        """Where the model comes from, its parameters, stored dtype and tokenizer: a warm
        start is counted from its weights file without building it (nor importing
        transformers' modeling code), a Hugging Face folder on the meta device."""
        if self.config is None and self.dir is not None and (self.dir / METADATA_FILE).is_file():
            (parameters, stored) = stored_parameters(self.dir)
            return SourceFacts(f"warm start {self.dir}", parameters, stored,
                               load_tokenizer_dir(str(self.dir)))
        if self.is_hf_folder:
            assert self.dir is not None
            model, tokenizer, stored = hf_model_on_meta(self.dir)
            where = str(self.dir)
        else:
            model, tokenizer = self.model_factory()()
            stored = str(next(model.parameters()).dtype).removeprefix("torch.")
            where = "tiny model from config"
        return SourceFacts(where, sum(p.numel() for p in model.parameters()), stored, tokenizer)

    @contextlib.contextmanager
    def served(self, engine: str) -> Iterator[str | None]:
        """`engine_folder` for the length of a ``with`` block (probe runs, say)."""
        path, exported = self.engine_folder(engine)
        try:
            yield path
        finally:
            if exported is not None:
                exported.cleanup()

    def engine_folder(self, engine: str
                      ) -> tuple[str | None, tempfile.TemporaryDirectory[str] | None]:
        """The Hugging Face folder the rollout `engine` loads (vLLM and SGLang read a folder;
        HF ``generate`` takes the factory's model: None), and the temporary folder exported
        for it when the model is not in one already (the caller removes it when done)."""
        if engine == "hf":
            return None, None
        if self.is_hf_folder:
            return str(self.dir), None
        folder = tempfile.TemporaryDirectory(prefix="rlinf-flow-model-")
        model, tokenizer = self.model_factory()()
        model.save_pretrained(folder.name)  # type: ignore[operator]
        tokenizer.save_pretrained(folder.name)
        return folder.name, folder
