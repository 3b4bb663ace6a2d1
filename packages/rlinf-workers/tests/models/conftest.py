"""Shared tiny model and tokenizer (building them is cheap, importing transformers is not)."""

from __future__ import annotations

import pytest
from transformers import PreTrainedModel, PreTrainedTokenizerFast

from rlinf.workers.models import TinyLMConfig, build_char_tokenizer, build_tiny_causal_lm


@pytest.fixture(scope="session")
def char_tokenizer() -> PreTrainedTokenizerFast:
    return build_char_tokenizer()


@pytest.fixture(scope="session")
def tiny_lm(char_tokenizer: PreTrainedTokenizerFast) -> PreTrainedModel:
    # eager attention: the manual reference computations below use the same kernels
    return build_tiny_causal_lm(TinyLMConfig(attn_implementation="eager"), seed=0,
                                tokenizer=char_tokenizer)
