"""The PPO loss of one embodied minibatch, where every sample is valid.

`rlinf.workers.algorithms` writes its losses for padded token batches: every reduction is
masked, every statistic a masked mean. An embodied PPO minibatch has no padding (each env
step is one valid sample), and at the widths users run (64x64, 256x256 MLPs on minibatches
of 64) those masks were half the ops of an update (HalfCheetah shapes, one thread). This
module is that math (clipped surrogate with log-ratio clamp, optional clipped value loss,
entropy bonus, advantages whitened with the unbiased variance) on plain means; a test holds
it equal to the masked losses, value and gradients, within float32 rounding.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from rlinf.workers.models.policy import ActionEval

__all__ = ["MAX_LOG_RATIO", "PPOTerms", "ppo_terms"]

MAX_LOG_RATIO = 20.0  # as rlinf.workers.algorithms.losses: exp() stays finite
_WHITEN_EPS = 1e-8  # as masked_whiten


@dataclass(frozen=True)
class PPOTerms:
    """The differentiable loss and its statistics (detached, one tensor each)."""

    loss: torch.Tensor
    stats: dict[str, torch.Tensor]


def ppo_terms(ev: ActionEval, *, old_log_probs: torch.Tensor, old_values: torch.Tensor,
              advantages: torch.Tensor, returns: torch.Tensor, clip_ratio: float,
              value_clip: float | None, value_coef: float, entropy_coef: float,
              normalize_advantages: bool,
              importance: torch.Tensor | None = None) -> PPOTerms:
    """``policy + value_coef * value - entropy_coef * entropy`` over samples ``[B]``.
    `importance`: per-sample weights of the surrogate (a lagging behaviour policy's
    correction, applied after whitening; `old_log_probs` are then the proximal policy's)."""
    adv = advantages
    if normalize_advantages and adv.numel() > 1:
        adv = (adv - adv.mean()) * torch.rsqrt(adv.var(unbiased=True) + _WHITEN_EPS)
    if importance is not None:
        adv = adv * importance
    log_ratio = (ev.log_prob - old_log_probs).clamp(min=-MAX_LOG_RATIO, max=MAX_LOG_RATIO)
    ratio = torch.exp(log_ratio)
    unclipped = -adv * ratio
    clipped = -adv * ratio.clamp(min=1.0 - clip_ratio, max=1.0 + clip_ratio)
    policy_loss = torch.maximum(unclipped, clipped).mean()
    errors = (ev.value - returns).square()
    if value_clip is None:
        value_loss = 0.5 * errors.mean()
    else:
        clipped_values = old_values + (ev.value - old_values).clamp(min=-value_clip,
                                                                     max=value_clip)
        value_loss = 0.5 * torch.maximum(errors, (clipped_values - returns).square()).mean()
    entropy = ev.entropy.mean()
    loss = policy_loss + value_coef * value_loss - entropy_coef * entropy
    with torch.no_grad():
        stats = {"policy_loss": policy_loss.detach(),
                 "clip_fraction": (clipped > unclipped).float().mean(),
                 "approx_kl": (-log_ratio).mean(),
                 "value_loss": value_loss.detach(), "entropy": entropy.detach()}
    return PPOTerms(loss=loss, stats=stats)
