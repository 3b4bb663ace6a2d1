"""`TinyLMConfig`, the architecture of the tiny causal LMs, in a module of its own: a
process that only reads or ships the config (a driver, a reward worker) does not import
transformers' modeling code (seconds of CPU per process), which `causal_lm` needs to build one."""

from __future__ import annotations

from dataclasses import dataclass

from rlinf.workers.errors import ConfigError

__all__ = ["TinyLMConfig"]


@dataclass(frozen=True)
class TinyLMConfig:
    """Architecture of a tiny Qwen2-style decoder."""

    vocab_size: int = 100
    """Number of token ids; must cover the tokenizer (the char tokenizer has 100)."""
    hidden_size: int = 128
    """Width of the residual stream."""
    num_layers: int = 2
    """Number of decoder layers."""
    num_heads: int = 4
    """Attention heads; must divide `hidden_size`."""
    num_kv_heads: int = 2
    """Key/value heads (grouped-query attention); must divide `num_heads`."""
    intermediate_size: int = 256
    """Width of the MLP's hidden layer."""
    max_position_embeddings: int = 512
    """Longest prompt + response the model is built for."""
    tie_word_embeddings: bool = True
    """Share the input embedding with the output head (halves the embedding parameters)."""
    attn_implementation: str = "sdpa"
    """Hugging Face attention backend: "sdpa" or "eager"."""

    def __post_init__(self) -> None:
        if self.hidden_size % self.num_heads != 0:
            raise ConfigError(
                f"num_heads ({self.num_heads}) must divide hidden_size ({self.hidden_size})"
            )
        if self.num_heads % self.num_kv_heads != 0:
            raise ConfigError(
                f"num_kv_heads ({self.num_kv_heads}) must divide num_heads ({self.num_heads})"
            )
        if min(self.vocab_size, self.num_layers, self.intermediate_size) < 1:
            raise ConfigError(f"sizes must be >= 1, got {self}")
