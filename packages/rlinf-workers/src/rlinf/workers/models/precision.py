"""Compute precision of model forwards: fp32, or bf16 autocast over fp32 weights.

bf16 autocast runs matmuls in bfloat16 while parameters, gradients and optimizer state stay
float32 (mixed precision as veRL, OpenRLHF and TRL's ``bf16=True`` train). On a CPU with
AVX-512 BF16 a bf16 matmul has several times the fp32 throughput; on GPUs it is the usual
setting. Log-probs are always returned in float32 (`response_logits` upcasts the logits).
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Literal, get_args

import torch

from rlinf.workers.errors import ConfigError

__all__ = ["Precision", "check_precision", "compute_precision"]

Precision = Literal["fp32", "bf16"]


def check_precision(precision: str) -> Precision:
    """`precision` if it is one of `Precision`, else a `ConfigError` naming the choices."""
    if precision not in get_args(Precision):
        raise ConfigError(f"precision must be 'fp32' or 'bf16', got {precision!r}")
    return precision  # type: ignore[return-value]


@contextlib.contextmanager
def compute_precision(precision: Precision, device: torch.device | str) -> Iterator[None]:
    """Forwards inside run at `precision` on `device` ("bf16": autocast to bfloat16)."""
    if check_precision(precision) == "fp32":
        yield
        return
    device_type = torch.device(device).type
    with torch.autocast(device_type=device_type, dtype=torch.bfloat16):
        yield
