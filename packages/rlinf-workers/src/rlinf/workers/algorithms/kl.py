"""KL estimators between the policy and a reference policy, per token, from log-probs.

With ``log_ratio = log pi(x) - log pi_ref(x)`` for tokens x sampled from pi (Schulman,
"Approximating KL divergence", 2020):

- ``k1 = log_ratio``: unbiased for KL(pi || ref), high variance, can be negative.
- ``k2 = log_ratio**2 / 2``: biased, low variance, always >= 0.
- ``k3 = exp(-log_ratio) - 1 + log_ratio``: unbiased, low variance, always >= 0.
- ``low-var-kl``: k3 clamped to [-10, 10] (the clamp verl applies so a single token with a
  huge ratio cannot blow up the loss).
"""

from __future__ import annotations

import enum

import torch

from rlinf.workers.algorithms._config_enum import parse_config_enum
from rlinf.workers.algorithms.masked import check_same_shape

__all__ = ["KLEstimator", "kl_penalty"]

_LOW_VAR_CLAMP = 10.0


class KLEstimator(enum.Enum):
    """Which per-token KL estimator to use (see the module docstring)."""

    K1 = "k1"
    K2 = "k2"
    K3 = "k3"
    LOW_VAR_KL = "low-var-kl"

    @classmethod
    def parse(cls, value: KLEstimator | str) -> KLEstimator:
        """Accept the enum or its string value (as written in configs)."""
        return parse_config_enum(cls, value, what="KL estimator")


def kl_penalty(
    log_probs: torch.Tensor, ref_log_probs: torch.Tensor, *, estimator: KLEstimator | str
) -> torch.Tensor:
    """Per-token KL estimate of the policy to the reference, same shape as ``log_probs``."""
    check_same_shape(log_probs=log_probs, ref_log_probs=ref_log_probs)
    kind = KLEstimator.parse(estimator)
    log_ratio = log_probs - ref_log_probs
    if kind is KLEstimator.K1:
        return log_ratio
    if kind is KLEstimator.K2:
        return 0.5 * log_ratio.square()
    k3 = torch.expm1(-log_ratio) + log_ratio
    if kind is KLEstimator.LOW_VAR_KL:
        return k3.clamp(min=-_LOW_VAR_CLAMP, max=_LOW_VAR_CLAMP)
    return k3
