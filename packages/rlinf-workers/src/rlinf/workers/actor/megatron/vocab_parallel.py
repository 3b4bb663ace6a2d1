"""Log-probs and entropy of logits whose vocabulary is split across tensor-parallel ranks.

Each rank holds ``[..., V/tp]`` logits (megatron's output layer is column-parallel). Only
scalars per token cross ranks: the max, the sum of exponentials, the label's logit and the
sum of ``exp(z) * z``; the full ``[..., V]`` logits are never gathered. Every cross-rank
sum has per-rank terms that depend on that rank's logits only and is reduced with
megatron-core's all-reduce whose backward is the identity (each rank computes the same
loss), so each rank's gradient is the exact partial derivative of that loss. With one
tensor-parallel rank this is `token_log_probs` and `entropy_from_logits`.
"""

from __future__ import annotations

import torch

from rlinf.workers.algorithms.losses import entropy_from_logits
from rlinf.workers.models import token_log_probs

__all__ = ["vocab_parallel_log_probs_and_entropy"]


def vocab_parallel_log_probs_and_entropy(
    logits: torch.Tensor, labels: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """``log p(label)`` and the entropy per position, both ``[...]``, from this rank's
    ``[..., V/tp]`` share of the logits (fp32)."""
    import torch.distributed as dist
    from megatron.core import parallel_state
    from megatron.core.tensor_parallel.mappings import (
        reduce_from_tensor_model_parallel_region as sum_over_ranks,
    )

    logits = logits.float()
    if parallel_state.get_tensor_model_parallel_world_size() == 1:
        return token_log_probs(logits, labels), entropy_from_logits(logits)
    group = parallel_state.get_tensor_model_parallel_group()
    # The max only keeps exp() finite: every result is invariant to it, so no gradient.
    top = logits.detach().max(dim=-1).values
    dist.all_reduce(top, op=dist.ReduceOp.MAX, group=group)
    shifted = logits - top.unsqueeze(-1)
    exp = shifted.exp()
    total = sum_over_ranks(exp.sum(dim=-1))
    width = logits.shape[-1]
    local = labels.long() - parallel_state.get_tensor_model_parallel_rank() * width
    here = (local >= 0) & (local < width)
    picked = shifted.gather(-1, local.clamp(0, width - 1).unsqueeze(-1)).squeeze(-1)
    label_logit = sum_over_ranks(torch.where(here, picked, torch.zeros_like(picked)))
    log_total = total.log()
    weighted = sum_over_ranks((exp * shifted).sum(dim=-1))
    return label_logit - log_total, log_total - weighted / total
