"""Models shared by the workers: tiny causal LMs, a char tokenizer, actor-critics, log-probs."""

from rlinf.workers.models.causal_lm import TinyLMConfig, build_tiny_causal_lm, build_tiny_model
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
from rlinf.workers.models.tokenizer import (
    ARITHMETIC_ALPHABET,
    SPECIAL_TOKENS,
    build_char_tokenizer,
    load_tokenizer,
)

__all__ = [
    "ARITHMETIC_ALPHABET",
    "SPECIAL_TOKENS",
    "ActionEval",
    "ActionSample",
    "ActorCritic",
    "PolicyConfig",
    "Precision",
    "TinyLMConfig",
    "build_actor_critic",
    "build_char_tokenizer",
    "build_tiny_causal_lm",
    "build_tiny_model",
    "check_precision",
    "compute_precision",
    "load_tokenizer",
    "position_ids_from_mask",
    "response_log_probs",
    "response_log_probs_and_entropy",
    "response_logits",
    "response_mask_from_eos",
    "token_log_probs",
]
