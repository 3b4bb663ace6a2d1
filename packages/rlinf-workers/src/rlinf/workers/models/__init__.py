"""Models shared by the workers: tiny causal LMs, a char tokenizer, actor-critics, log-probs.

The causal LM and the tokenizer need transformers, which an embodied run's actor-critics do
not: their names are imported on first use (`rlinf.workers._lazy`).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from rlinf.workers._lazy import lazy_attribute
from rlinf.workers.models.attention import (
    GQA_SDPA,
    AttentionChoice,
    attention_kernel,
    check_attention,
    generation_attention,
    training_attention,
)
from rlinf.workers.models.logprobs import (
    position_ids_from_mask,
    response_log_probs,
    response_log_probs_and_entropy,
    response_logits,
    response_mask_from_eos,
    token_log_probs,
)
from rlinf.workers.models.policy import (
    ActionEval,
    ActionSample,
    ActorCritic,
    PolicyConfig,
    build_actor_critic,
)
from rlinf.workers.models.precision import Precision, check_precision, compute_precision

if TYPE_CHECKING:
    from rlinf.workers.models.causal_lm import build_tiny_causal_lm, build_tiny_model
    from rlinf.workers.models.lm_config import TinyLMConfig
    from rlinf.workers.models.tokenizer import (
        ARITHMETIC_ALPHABET,
        SPECIAL_TOKENS,
        build_char_tokenizer,
        load_tokenizer,
    )

_LAZY = {
    "TinyLMConfig": "lm_config", "build_tiny_causal_lm": "causal_lm",
    "build_tiny_model": "causal_lm", "ARITHMETIC_ALPHABET": "tokenizer",
    "SPECIAL_TOKENS": "tokenizer", "build_char_tokenizer": "tokenizer",
    "load_tokenizer": "tokenizer",
}


def __getattr__(name: str) -> Any:
    return lazy_attribute(__name__, _LAZY, name)


__all__ = [
    "ARITHMETIC_ALPHABET",
    "GQA_SDPA",
    "SPECIAL_TOKENS",
    "ActionEval",
    "ActionSample",
    "ActorCritic",
    "AttentionChoice",
    "PolicyConfig",
    "Precision",
    "TinyLMConfig",
    "attention_kernel",
    "build_actor_critic",
    "build_char_tokenizer",
    "build_tiny_causal_lm",
    "build_tiny_model",
    "check_attention",
    "check_precision",
    "compute_precision",
    "generation_attention",
    "load_tokenizer",
    "position_ids_from_mask",
    "response_log_probs",
    "response_log_probs_and_entropy",
    "response_logits",
    "response_mask_from_eos",
    "token_log_probs",
    "training_attention",
]
