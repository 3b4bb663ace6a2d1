"""Tiny Qwen2-style causal LMs built from a config: no download, deterministic under a seed.

The default (hidden 128, 2 layers, 100-token vocabulary) has about 0.3M parameters and
generates 64 x 32 tokens in well under a second on one CPU core — big enough to exercise
every code path of rollout, inference and training, small enough for CI.
"""

from __future__ import annotations

import torch
from transformers import PreTrainedModel, PreTrainedTokenizerBase, Qwen2Config, Qwen2ForCausalLM

from rlinf.workers.errors import ConfigError
from rlinf.workers.models.lm_config import TinyLMConfig
from rlinf.workers.models.tokenizer import build_char_tokenizer

__all__ = ["TinyLMConfig", "build_tiny_causal_lm", "build_tiny_model"]

_DEFAULT = TinyLMConfig()  # frozen, so one shared default is safe


def build_tiny_causal_lm(
    config: TinyLMConfig = _DEFAULT,
    *,
    seed: int,
    tokenizer: PreTrainedTokenizerBase | None = None,
) -> PreTrainedModel:
    """A randomly initialised `Qwen2ForCausalLM` of `config`, identical for equal `seed`.

    With `tokenizer`, its pad/bos/eos ids go into the model and generation config (so
    `generate` stops at EOS and pads with the right id) and the vocabulary is checked to
    cover it. The global torch RNG is left untouched.
    """
    pad_id = bos_id = eos_id = None
    if tokenizer is not None:
        if len(tokenizer) > config.vocab_size:
            raise ConfigError(
                f"vocab_size {config.vocab_size} is smaller than the tokenizer's "
                f"{len(tokenizer)} tokens"
            )
        pad_id, bos_id, eos_id = (
            tokenizer.pad_token_id, tokenizer.bos_token_id, tokenizer.eos_token_id
        )
    hf_config = Qwen2Config(
        vocab_size=config.vocab_size,
        hidden_size=config.hidden_size,
        num_hidden_layers=config.num_layers,
        num_attention_heads=config.num_heads,
        num_key_value_heads=config.num_kv_heads,
        intermediate_size=config.intermediate_size,
        max_position_embeddings=config.max_position_embeddings,
        tie_word_embeddings=config.tie_word_embeddings,
        use_sliding_window=False,
        pad_token_id=pad_id,
        bos_token_id=bos_id,
        eos_token_id=eos_id,
    )
    hf_config._attn_implementation = config.attn_implementation
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = Qwen2ForCausalLM(hf_config)
    if tokenizer is not None:
        model.generation_config.pad_token_id = pad_id
        model.generation_config.bos_token_id = bos_id
        model.generation_config.eos_token_id = eos_id
    model.eval()
    return model


def build_tiny_model(
    config: TinyLMConfig = _DEFAULT, *, seed: int
) -> tuple[PreTrainedModel, PreTrainedTokenizerBase]:
    """A fresh tiny model of `config` with the char tokenizer (identical for equal `seed`):
    a model factory for the reasoning roles, e.g.
    ``RoleSetup(model_factory=functools.partial(build_tiny_model, config, seed=0))``."""
    tokenizer = build_char_tokenizer()
    return build_tiny_causal_lm(config, seed=seed, tokenizer=tokenizer), tokenizer
