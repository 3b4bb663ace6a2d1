"""PPO-family losses: clipped (optionally dual-clipped) policy loss, clipped value loss, entropy.

Per-token losses are reduced by `aggregate_loss`; every function takes the aggregation mode
explicitly because it changes the gradient (see `rlinf.workers.algorithms.aggregation`).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from rlinf.workers.algorithms.aggregation import LossAggregation, aggregate_loss
from rlinf.workers.algorithms.masked import check_same_shape, masked_mean
from rlinf.workers.errors import ConfigError

__all__ = ["PolicyLoss", "ValueLoss", "entropy_from_logits", "ppo_policy_loss", "value_loss"]

# exp() of a log-ratio beyond this overflows float16 and makes the loss meaningless anyway.
_MAX_LOG_RATIO = 20.0


@dataclass(frozen=True)
class PolicyLoss:
    """Result of `ppo_policy_loss`; the statistics are detached scalars for logging."""

    loss: torch.Tensor
    """Aggregated clipped surrogate loss (scalar, differentiable)."""
    clip_fraction: torch.Tensor
    """Fraction of valid tokens whose ratio was clipped (the clipped term was the larger)."""
    dual_clip_fraction: torch.Tensor
    """Fraction of valid tokens bounded by the dual clip (0 when dual clip is off)."""
    approx_kl: torch.Tensor
    """Mean of ``old_log_probs - log_probs`` over valid tokens (k1 estimate of KL(old||new))."""


@dataclass(frozen=True)
class ValueLoss:
    """Result of `value_loss`."""

    loss: torch.Tensor
    """Aggregated (clipped) squared-error value loss (scalar, differentiable)."""
    clip_fraction: torch.Tensor
    """Fraction of valid tokens where the clipped error was the larger one."""


def ppo_policy_loss(
    log_probs: torch.Tensor,
    old_log_probs: torch.Tensor,
    advantages: torch.Tensor,
    mask: torch.Tensor,
    *,
    clip_ratio: float = 0.2,
    clip_ratio_high: float | None = None,
    dual_clip: float | None = None,
    aggregation: LossAggregation | str = LossAggregation.TOKEN_MEAN,
    token_weights: torch.Tensor | None = None,
) -> PolicyLoss:
    """PPO clipped surrogate, per token ``max(-A r, -A clip(r, 1 - eps_lo, 1 + eps_hi))``.

    ``r = exp(log_probs - old_log_probs)``. ``clip_ratio_high`` sets a separate upper bound
    (DAPO's clip-higher; default: ``clip_ratio``). ``dual_clip = c > 1`` additionally bounds
    the loss of negative-advantage tokens by ``-c * A`` (dual-clip PPO), so a token whose
    ratio exploded cannot dominate the batch. `token_weights` (detached, e.g.
    `rollout_correction_weights`) scale each token's loss before aggregation.
    """
    check_same_shape(
        log_probs=log_probs, old_log_probs=old_log_probs, advantages=advantages, mask=mask
    )
    high = clip_ratio if clip_ratio_high is None else clip_ratio_high
    if clip_ratio < 0 or high < 0:
        raise ConfigError(f"clip ratios must be >= 0, got low={clip_ratio}, high={high}")
    if dual_clip is not None and dual_clip <= 1.0:
        raise ConfigError(f"dual_clip must be > 1 (a multiple of -advantage), got {dual_clip}")
    log_ratio = (log_probs - old_log_probs).clamp(min=-_MAX_LOG_RATIO, max=_MAX_LOG_RATIO)
    ratio = torch.exp(log_ratio)
    unclipped = -advantages * ratio
    clipped = -advantages * ratio.clamp(min=1.0 - clip_ratio, max=1.0 + high)
    losses = torch.maximum(unclipped, clipped)
    dual_hit = torch.zeros_like(losses, dtype=torch.bool)
    if dual_clip is not None:
        bound = -advantages * dual_clip
        dual_hit = (advantages < 0) & (losses > bound)
        losses = torch.where(dual_hit, bound, losses)
    if token_weights is not None:
        check_same_shape(log_probs=log_probs, token_weights=token_weights)
        losses = losses * token_weights.detach()
    mask_f = mask.to(losses.dtype)
    with torch.no_grad():
        clip_fraction = masked_mean((clipped > unclipped).to(losses.dtype), mask_f)
        dual_fraction = masked_mean(dual_hit.to(losses.dtype), mask_f)
        approx_kl = masked_mean(-log_ratio, mask_f)
    return PolicyLoss(
        loss=aggregate_loss(losses, mask_f, mode=aggregation),
        clip_fraction=clip_fraction,
        dual_clip_fraction=dual_fraction,
        approx_kl=approx_kl,
    )


def value_loss(
    values: torch.Tensor,
    old_values: torch.Tensor,
    returns: torch.Tensor,
    mask: torch.Tensor,
    *,
    clip_range: float | None = None,
    aggregation: LossAggregation | str = LossAggregation.TOKEN_MEAN,
) -> ValueLoss:
    """Per-token ``0.5 * (v - R)^2``; with ``clip_range`` the PPO clipped form
    ``0.5 * max((v - R)^2, (old + clip(v - old, -c, c) - R)^2)``."""
    check_same_shape(values=values, old_values=old_values, returns=returns, mask=mask)
    errors = (values - returns).square()
    mask_f = mask.to(values.dtype)
    if clip_range is None:
        return ValueLoss(
            loss=aggregate_loss(0.5 * errors, mask_f, mode=aggregation),
            clip_fraction=torch.zeros((), dtype=values.dtype, device=values.device),
        )
    if clip_range < 0:
        raise ConfigError(f"clip_range must be >= 0, got {clip_range}")
    clipped_values = old_values + (values - old_values).clamp(min=-clip_range, max=clip_range)
    clipped_errors = (clipped_values - returns).square()
    with torch.no_grad():
        clip_fraction = masked_mean((clipped_errors > errors).to(values.dtype), mask_f)
    losses = 0.5 * torch.maximum(errors, clipped_errors)
    return ValueLoss(loss=aggregate_loss(losses, mask_f, mode=aggregation),
                     clip_fraction=clip_fraction)


def entropy_from_logits(logits: torch.Tensor) -> torch.Tensor:
    """Entropy of the categorical distribution over the last dimension, ``[...]``.

    ``H = logsumexp(z) - sum(softmax(z) * z)``: one softmax, no log of tiny probabilities.
    """
    probs = torch.softmax(logits, dim=-1)
    return torch.logsumexp(logits, dim=-1) - (probs * logits).sum(dim=-1)
