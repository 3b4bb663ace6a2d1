"""Tiny causal LM: shapes, determinism under a seed, save/load, config validation."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from transformers import AutoModelForCausalLM, PreTrainedModel, PreTrainedTokenizerFast

from rlinf.workers.errors import ConfigError
from rlinf.workers.models import TinyLMConfig, build_tiny_causal_lm, build_tiny_model


def test_shapes_and_special_ids(
    tiny_lm: PreTrainedModel, char_tokenizer: PreTrainedTokenizerFast
) -> None:
    ids = torch.randint(4, 100, (3, 7), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        logits = tiny_lm(input_ids=ids).logits
    assert logits.shape == (3, 7, 100)
    assert tiny_lm.generation_config.eos_token_id == char_tokenizer.eos_token_id
    assert tiny_lm.generation_config.pad_token_id == char_tokenizer.pad_token_id
    assert sum(p.numel() for p in tiny_lm.parameters()) < 1_000_000


def test_deterministic_under_seed_and_rng_untouched() -> None:
    before = torch.random.get_rng_state()
    a = build_tiny_causal_lm(seed=7).state_dict()
    b = build_tiny_causal_lm(seed=7).state_dict()
    c = build_tiny_causal_lm(seed=8).state_dict()
    assert torch.equal(torch.random.get_rng_state(), before)
    assert all(torch.equal(a[k], b[k]) for k in a)
    assert not all(torch.equal(a[k], c[k]) for k in a)


def test_save_load_round_trip(tiny_lm: PreTrainedModel, tmp_path: Path) -> None:
    tiny_lm.save_pretrained(tmp_path)
    loaded = AutoModelForCausalLM.from_pretrained(tmp_path, local_files_only=True).eval()
    ids = torch.tensor([[5, 76, 5, 84]])
    with torch.no_grad():
        torch.testing.assert_close(loaded(input_ids=ids).logits, tiny_lm(input_ids=ids).logits)


def test_config_validation(char_tokenizer: PreTrainedTokenizerFast) -> None:
    with pytest.raises(ConfigError, match="num_heads"):
        TinyLMConfig(hidden_size=130, num_heads=4)
    with pytest.raises(ConfigError, match="num_kv_heads"):
        TinyLMConfig(num_heads=4, num_kv_heads=3)
    with pytest.raises(ConfigError, match="vocab_size"):
        build_tiny_causal_lm(TinyLMConfig(vocab_size=50), seed=0, tokenizer=char_tokenizer)


def test_build_tiny_model_pairs_the_model_with_the_char_tokenizer() -> None:
    config = TinyLMConfig(hidden_size=32, num_layers=1, intermediate_size=64)
    model, tokenizer = build_tiny_model(config, seed=3)
    again, _ = build_tiny_model(config, seed=3)
    assert model.generation_config.eos_token_id == tokenizer.eos_token_id
    assert len(tokenizer) <= config.vocab_size
    assert all(torch.equal(a, b) for a, b in zip(model.parameters(), again.parameters(),
                                                  strict=True))
