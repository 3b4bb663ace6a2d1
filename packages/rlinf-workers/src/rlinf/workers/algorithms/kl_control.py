"""KL to the reference as a reward penalty, with a fixed or adaptive coefficient.

veRL's ``algorithm.use_kl_in_reward``: before advantages are computed, every response
token's reward loses ``beta * kl_t``, where ``kl_t`` is the per-token KL estimate of the
policy that sampled the batch to the reference (`kl_penalty`). ``beta`` comes from a
controller updated once per training step from the KL it measured on that step's batch:

- fixed: ``beta`` never changes;
- adaptive (Ziegler et al. 2019, "Fine-Tuning Language Models from Human Preferences"):
  ``beta *= 1 + clip(kl / target - 1, -0.2, 0.2) * n / horizon``, with ``n`` the
  batch's responses, so ``beta`` grows while the KL is above target and shrinks below it.

The measured KL is veRL's: each response's mean over its valid tokens, averaged over the
responses.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

import torch

from rlinf.workers.algorithms.kl import KLEstimator, kl_penalty
from rlinf.workers.algorithms.masked import check_same_shape
from rlinf.workers.errors import ConfigError

__all__ = ["KLControlKind", "KLController", "RewardKL", "kl_reward_penalty"]

KLControlKind = Literal["fixed", "adaptive"]

_MAX_PROPORTIONAL_ERROR = 0.2  # as veRL and Ziegler et al.


class KLController:
    """The coefficient of the KL reward penalty (see the module docstring)."""

    def __init__(self, *, kind: KLControlKind, coef: float, target: float = 0.1,
                 horizon: int = 10_000) -> None:
        if kind not in ("fixed", "adaptive"):
            raise ConfigError(f"kl_ctrl must be 'fixed' or 'adaptive', got {kind!r}")
        if coef <= 0:
            raise ConfigError(f"the KL reward coefficient must be > 0, got {coef}")
        if kind == "adaptive" and (target <= 0 or horizon < 1):
            raise ConfigError(f"an adaptive KL controller needs target_kl > 0 and "
                              f"kl_horizon >= 1, got {target} and {horizon}")
        self.kind: KLControlKind = kind
        self.value = float(coef)
        """The current coefficient ``beta``."""
        self.target = float(target)
        self.horizon = int(horizon)

    def update(self, current_kl: float, *, responses: int) -> float:
        """Move the coefficient after a step whose batch of `responses` responses measured
        `current_kl`; returns the new coefficient (unchanged when fixed)."""
        if self.kind == "adaptive":
            error = min(max(current_kl / self.target - 1.0, -_MAX_PROPORTIONAL_ERROR),
                        _MAX_PROPORTIONAL_ERROR)
            self.value *= 1.0 + error * responses / self.horizon
        return self.value


@dataclass(frozen=True)
class RewardKL:
    """Result of `kl_reward_penalty`."""

    penalty: torch.Tensor
    """``[B, T]`` ``coef * kl`` on valid tokens (0 on padding), what each token's reward
    loses."""
    kl_sum: float
    """Sum over responses of each one's mean KL over its valid tokens (empty ones count 0)."""
    responses: int
    """Responses with at least one valid token."""


def kl_reward_penalty(
    log_probs: torch.Tensor, ref_log_probs: torch.Tensor, mask: torch.Tensor, *,
    coef: float, estimator: KLEstimator | str,
) -> RewardKL:
    """``coef`` times the per-token KL of `log_probs` (the sampling policy's) to
    `ref_log_probs`, plus the sums a controller's measured KL is built from (to be summed
    over data-parallel ranks before dividing, so that every rank's controller moves alike)."""
    check_same_shape(log_probs=log_probs, ref_log_probs=ref_log_probs, mask=mask)
    weights = mask.float()
    kl = kl_penalty(log_probs.float(), ref_log_probs.float(), estimator=estimator) * weights
    lengths = weights.sum(dim=-1)
    present = lengths > 0
    per_response = kl.sum(dim=-1) / lengths.clamp(min=1.0)
    return RewardKL(penalty=coef * kl,
                    kl_sum=float(per_response[present].sum()),
                    responses=int(present.sum()))
