"""KL estimators between the policy and a reference policy, per token, from log-probs.

With ``log_ratio = log pi(x) - log pi_ref(x)`` for tokens x sampled from pi (Schulman,
"Approximating KL divergence", 2020), named as veRL's `kl_penalty` names them, so a veRL
config means the same here:

- ``k1`` (alias ``kl``) ``= log_ratio``: unbiased for KL(pi || ref), high variance, can be
  negative.
- ``abs = |log_ratio|``.
- ``k2`` (alias ``mse``) ``= log_ratio**2 / 2``: biased, low variance, always >= 0.
- ``k3`` = ``low-var-kl`` (alias ``low_var_kl``): ``exp(-r) - 1 + r`` with ``r = log_ratio``
  clamped to [-20, 20] first and the result clamped to [-10, 10], as veRL computes it: one
  token whose ratio is astronomically off gives a bounded value and a zero gradient
  (unclamped, a log-ratio of -100 overflows exp and the gradient is NaN).
- ``k3-unclamped``: Schulman's k3 as written, unbiased and unbounded.
"""

from __future__ import annotations

import enum

import torch

from rlinf.workers.algorithms._config_enum import parse_config_enum
from rlinf.workers.algorithms.masked import check_same_shape

__all__ = ["KLEstimator", "kl_penalty"]

_LOG_RATIO_CLAMP = 20.0  # before exp, as veRL
_LOW_VAR_CLAMP = 10.0  # after, as veRL

_ALIASES = {"kl": "k1", "mse": "k2", "low_var_kl": "low-var-kl"}
"""veRL's other spellings of the same estimators."""


class KLEstimator(enum.Enum):
    """Which per-token KL estimator to use (see the module docstring)."""

    K1 = "k1"
    ABS = "abs"
    K2 = "k2"
    K3 = "k3"
    LOW_VAR_KL = "low-var-kl"
    K3_UNCLAMPED = "k3-unclamped"

    @classmethod
    def parse(cls, value: KLEstimator | str) -> KLEstimator:
        """Accept the enum, its string value or veRL's alias (as written in configs)."""
        if isinstance(value, str):
            value = _ALIASES.get(value, value)
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
    if kind is KLEstimator.ABS:
        return log_ratio.abs()
    if kind is KLEstimator.K2:
        return 0.5 * log_ratio.square()
    if kind is KLEstimator.K3_UNCLAMPED:
        return torch.expm1(-log_ratio) + log_ratio
    bounded = log_ratio.clamp(min=-_LOG_RATIO_CLAMP, max=_LOG_RATIO_CLAMP)
    k3 = torch.expm1(-bounded) + bounded
    return k3.clamp(min=-_LOW_VAR_CLAMP, max=_LOW_VAR_CLAMP)
