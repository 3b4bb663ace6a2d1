"""Tiny model, tokenizer and problems shared by this directory's tests (built offline)."""

from __future__ import annotations

import pytest
from transformers import PreTrainedModel, PreTrainedTokenizerFast

from rlinf.envs.math import MathProblem, ProblemGenerator
from rlinf.workers.models import TinyLMConfig, build_char_tokenizer, build_tiny_causal_lm

SMALL = TinyLMConfig(hidden_size=64, num_layers=2, num_heads=4, num_kv_heads=2,
                     intermediate_size=128, attn_implementation="eager")


@pytest.fixture(scope="session")
def tokenizer() -> PreTrainedTokenizerFast:
    return build_char_tokenizer()


@pytest.fixture
def model(tokenizer: PreTrainedTokenizerFast) -> PreTrainedModel:
    """A fresh model per test (tests train and overwrite it)."""
    return build_tiny_causal_lm(SMALL, seed=0, tokenizer=tokenizer)


@pytest.fixture(scope="session")
def problems() -> list[MathProblem]:
    return ProblemGenerator().generate(6)
