"""Truncated importance sampling between the rollout engine and the trainer.

A fast engine (vLLM, SGLang) samples from a slightly different distribution than the
trainer computes: other kernels, other precision. The PPO ratio is taken against the
trainer's own recomputed old log-probs, and each token's loss is weighted by
``min(pi_old / pi_rollout, cap)``, so tokens the engine over-sampled count less and no token
counts more than `cap` times. This is veRL's ``tis_imp_ratio_cap`` and TRL's
``vllm_importance_sampling_mode="token_truncate"`` (whose default, ``"sequence_mask"``, zeroes
whole sequences whose product of ratios leaves the bounds instead).
"""

from __future__ import annotations

import torch

from rlinf.workers.algorithms.masked import check_same_shape
from rlinf.workers.errors import ConfigError

__all__ = ["rollout_correction_weights"]


def rollout_correction_weights(old_log_probs: torch.Tensor, rollout_log_probs: torch.Tensor,
                               *, cap: float) -> torch.Tensor:
    """Per-token weights ``min(exp(old_log_probs - rollout_log_probs), cap)``, detached
    (a weight is a correction of the sampling distribution, not something to optimise).
    An overflowing ``exp`` gives inf, which the cap bounds; nothing here can be NaN."""
    check_same_shape(old_log_probs=old_log_probs, rollout_log_probs=rollout_log_probs)
    if not cap > 0:
        raise ConfigError(f"the rollout correction cap must be > 0, got {cap}")
    with torch.no_grad():
        return torch.exp(old_log_probs - rollout_log_probs).clamp(max=cap)
