"""Loss aggregation: how per-token losses ``[B, T]`` become one scalar.

The choice changes which tokens weigh most, so it is an explicit option everywhere:

- ``token-mean``: every valid token in the batch counts equally (DAPO's token-level loss);
  long responses contribute more tokens.
- ``seq-mean-token-sum``: sum over each sequence's tokens, then mean over sequences; the
  gradient grows with response length (Dr. GRPO uses it with a constant normaliser).
- ``seq-mean-token-mean``: mean over each sequence's tokens, then mean over sequences
  (the original GRPO); each sequence counts equally whatever its length.

Sequences without any valid token are left out of the sequence mean.
"""

from __future__ import annotations

import enum

import torch

from rlinf.workers.algorithms._config_enum import parse_config_enum
from rlinf.workers.algorithms.masked import check_same_shape, masked_mean
from rlinf.workers.errors import ShapeError

__all__ = ["LossAggregation", "aggregate_loss"]


class LossAggregation(enum.Enum):
    """How per-token losses are reduced to a scalar (see the module docstring)."""

    TOKEN_MEAN = "token-mean"
    SEQ_MEAN_TOKEN_SUM = "seq-mean-token-sum"
    SEQ_MEAN_TOKEN_MEAN = "seq-mean-token-mean"

    @classmethod
    def parse(cls, value: LossAggregation | str) -> LossAggregation:
        """Accept the enum or its string value (as written in configs)."""
        return parse_config_enum(cls, value, what="loss aggregation")


def aggregate_loss(
    losses: torch.Tensor, mask: torch.Tensor, *, mode: LossAggregation | str
) -> torch.Tensor:
    """Reduce per-token ``losses`` ``[B, T]`` under ``mask`` to a scalar by ``mode``."""
    check_same_shape(losses=losses, mask=mask)
    if losses.ndim != 2:
        raise ShapeError(f"expected per-token losses [B, T], got {tuple(losses.shape)}")
    agg = LossAggregation.parse(mode)
    if agg is LossAggregation.TOKEN_MEAN:
        return masked_mean(losses, mask)
    mask_f = mask.to(losses.dtype)
    per_seq = (losses * mask_f).sum(dim=-1)
    tokens = mask_f.sum(dim=-1)
    if agg is LossAggregation.SEQ_MEAN_TOKEN_MEAN:
        per_seq = per_seq / tokens.clamp(min=1.0)
    return masked_mean(per_seq, (tokens > 0).to(losses.dtype))
