"""The attention kernel of a training forward: the model's own, or one chosen per run.

transformers reads a model's attention kernel from ``config._attn_implementation`` at every
forward, so a trainer can pick it without rebuilding the model. PyTorch's fused CPU
attention (``sdpa``, transformers' default) is slow to differentiate in bf16 at short
sequences. Forward and backward of a 2-layer, 512-wide model over 4096 tokens in bf16
autocast on one core, with a padding mask (AVX-512 BF16 / AMX host), ran quicker with
eager attention than with ``sdpa`` at 64 and 128 columns, about as fast at 256, and slower
at 512 and 1024.

In fp32 the two kernels were close to each other at 64-256 columns, and on GPUs the
fused kernels win. ``auto`` therefore trains with eager attention on CPU in bf16 and keeps
the model's kernel elsewhere. The choice is one per run, not per micro-batch: every pass
that scores the trained policy for its loss (the recompute of the old log-probs, the
critic's old values) runs the same kernel, because in bf16 two kernels differ by ~1e-3 in
a log-prob, and the same kernel gives the same bits, so an on-policy first step has a
ratio of exactly 1. Runs of long rows (past ~256 columns) on CPU in bf16 train faster
with ``model``.

Generation on CPU runs `GQA_SDPA`: transformers' ``sdpa`` copies every key and value head
once per query head of its group (``repeat_kv``) whenever a padding mask is given, as it
is for every left-padded batch, so each decoding step copied the whole KV cache.
`GQA_SDPA` passes the grouped heads to PyTorch's kernel as they are (``enable_gqa``), with
the same mask and the same result: one decoding step's attention of 64 rows, 8 query and
4 KV heads of 64 dims, bf16, on one core, runs several times quicker this way at 60 and at 90
cached columns (the outputs equal). On GPUs a masked ``enable_gqa`` falls back to PyTorch's
math kernel, so there the model's kernel stays.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any, Literal, get_args

import torch
from torch import nn

from rlinf.workers.errors import ConfigError
from rlinf.workers.models.precision import Precision

__all__ = ["GQA_SDPA", "AttentionChoice", "attention_kernel", "check_attention",
           "generation_attention", "training_attention"]

AttentionChoice = Literal["auto", "model", "eager", "sdpa"]

GQA_SDPA = "rlinf_gqa_sdpa"
"""Name of the attention kernel `generation_attention` registers with transformers."""


def check_attention(choice: str) -> AttentionChoice:
    """`choice` if it is one of `AttentionChoice`, else a `ConfigError` naming the choices."""
    if choice not in get_args(AttentionChoice):
        raise ConfigError(f"attention must be one of {get_args(AttentionChoice)}, "
                          f"got {choice!r}")
    return choice  # type: ignore[return-value]


def training_attention(choice: AttentionChoice, *, precision: Precision,
                       device: torch.device) -> str | None:
    """The kernel every forward of the trained policy runs with under `choice` (None: the
    model's own): its training forwards and the passes whose numbers its loss compares
    them with (the module docstring)."""
    if choice == "model":
        return None
    if choice != "auto":
        return choice
    if device.type == "cpu" and precision == "bf16":
        return "eager"
    return None


def generation_attention(model: nn.Module, *, device: torch.device) -> str | None:
    """The kernel `model` generates with on `device`: `GQA_SDPA` on CPU where the model
    runs transformers' ``sdpa`` (registered on first use), else None (its own)."""
    if device.type != "cpu":
        return None
    configs = _attention_configs(model)
    if not configs or any(c._attn_implementation != "sdpa" for c in configs):
        return None
    _register_gqa_sdpa()
    return GQA_SDPA


def _gqa_sdpa(module: nn.Module, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
              attention_mask: torch.Tensor | None, *, dropout: float = 0.0,
              scaling: float | None = None, is_causal: bool | None = None,
              **_: Any) -> tuple[torch.Tensor, None]:
    """transformers' attention-kernel signature: [B, H, Q, D] queries against [B, KV, K, D]
    keys and values (KV dividing H), output [B, Q, H, D]. Causal without a mask only for a
    prefill (transformers gives a mask otherwise)."""
    own = getattr(module, "is_causal", True) if is_causal is None else is_causal
    causal = bool(query.shape[2] > 1 and attention_mask is None and own)
    out = torch.nn.functional.scaled_dot_product_attention(
        query, key, value, attn_mask=attention_mask, dropout_p=dropout, scale=scaling,
        is_causal=causal, enable_gqa=key.shape[1] != query.shape[1])
    return out.transpose(1, 2).contiguous(), None


def _register_gqa_sdpa() -> None:
    from transformers import AttentionInterface
    from transformers.masking_utils import ALL_MASK_ATTENTION_FUNCTIONS, sdpa_mask

    AttentionInterface.register(GQA_SDPA, _gqa_sdpa)
    ALL_MASK_ATTENTION_FUNCTIONS.register(GQA_SDPA, sdpa_mask)


@contextlib.contextmanager
def attention_kernel(model: nn.Module, kernel: str | None) -> Iterator[None]:
    """Forwards of `model` (a wrapper's module included) inside run with attention
    `kernel`; the model's own kernel is restored on exit. None changes nothing, and so
    does a model without a transformers config (it has one attention of its own)."""
    configs = [] if kernel is None else _attention_configs(model)
    saved = [config._attn_implementation for config in configs]
    try:
        for config in configs:
            config._attn_implementation = kernel
        yield
    finally:
        for config, own in zip(configs, saved, strict=True):
            config._attn_implementation = own


def _attention_configs(model: nn.Module) -> list[Any]:
    """The distinct transformers configs of `model`'s modules (one for a causal LM; a
    critic's backbone brings its own)."""
    found: dict[int, Any] = {}
    for module in model.modules():
        config = getattr(module, "config", None)
        if config is not None and hasattr(config, "_attn_implementation"):
            found.setdefault(id(config), config)
    return list(found.values())
