"""The attention kernel of a training forward: the model's own, or chosen per micro-batch.

transformers reads a model's attention kernel from ``config._attn_implementation`` at every
forward, so a trainer can pick it per micro-batch. PyTorch's fused CPU attention (``sdpa``,
transformers' default) is slow to differentiate in bf16 at short sequences. Forward and
backward of a 2-layer, 512-wide model over 4096 tokens in bf16 autocast on one core, with
a padding mask (AVX-512 BF16 / AMX host, medians of 2):

| columns x rows | sdpa | eager |
| --- | --- | --- |
| 64 x 64 | 0.66 s | 0.51 s |
| 128 x 32 | 0.67 s | 0.53 s |
| 256 x 16 | 0.62 s | 0.61 s |
| 512 x 8 | 0.69 s | 1.04 s |
| 1024 x 4 | 0.82 s | 1.72 s |

In fp32 the two kernels were within 4% of each other at 64-256 columns, and on GPUs the
fused kernels win. ``auto`` therefore trains with eager attention only on CPU, in bf16, for
micro-batches of at most `EAGER_MAX_COLUMNS` columns, and keeps the model's kernel elsewhere.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any, Literal, get_args

import torch
from torch import nn

from rlinf.workers.errors import ConfigError
from rlinf.workers.models.precision import Precision

__all__ = ["EAGER_MAX_COLUMNS", "AttentionChoice", "attention_kernel", "check_attention",
           "training_attention"]

AttentionChoice = Literal["auto", "model", "eager", "sdpa"]

EAGER_MAX_COLUMNS = 256
"""Longest micro-batch (prompt + response columns) that ``auto`` trains with eager
attention on CPU in bf16 (the table above: eager is 20-25% faster up to 128, even at 256)."""


def check_attention(choice: str) -> AttentionChoice:
    """`choice` if it is one of `AttentionChoice`, else a `ConfigError` naming the choices."""
    if choice not in get_args(AttentionChoice):
        raise ConfigError(f"attention must be one of {get_args(AttentionChoice)}, "
                          f"got {choice!r}")
    return choice  # type: ignore[return-value]


def training_attention(choice: AttentionChoice, *, columns: int, precision: Precision,
                       device: torch.device) -> str | None:
    """The kernel a training forward over `columns` columns runs with under `choice`
    (None: the model's own)."""
    if choice == "model":
        return None
    if choice != "auto":
        return choice
    if device.type == "cpu" and precision == "bf16" and columns <= EAGER_MAX_COLUMNS:
        return "eager"
    return None


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
