"""RL algorithms as pure torch functions, shared by the reasoning and embodied workers.

Conventions: time (or token) is the last dimension; masks mark valid entries with 1; every
reduction over an empty mask returns 0, never NaN; options are keyword-only.
"""

from rlinf.workers.algorithms.advantages import (
    bootstrap_next_values,
    broadcast_to_tokens,
    discounted_returns,
    gae,
    grpo_advantages,
    place_at_last_token,
)
from rlinf.workers.algorithms.aggregation import LossAggregation, aggregate_loss
from rlinf.workers.algorithms.kl import KLEstimator, kl_penalty
from rlinf.workers.algorithms.kl_control import (
    KLControlKind,
    KLController,
    RewardKL,
    kl_reward_penalty,
)
from rlinf.workers.algorithms.losses import (
    PolicyLoss,
    ValueLoss,
    entropy_from_logits,
    ppo_policy_loss,
    value_loss,
)
from rlinf.workers.algorithms.masked import masked_mean, masked_sum, masked_var, masked_whiten
from rlinf.workers.algorithms.rollout_correction import rollout_correction_weights

__all__ = [
    "KLControlKind",
    "KLController",
    "KLEstimator",
    "LossAggregation",
    "PolicyLoss",
    "RewardKL",
    "ValueLoss",
    "aggregate_loss",
    "bootstrap_next_values",
    "broadcast_to_tokens",
    "discounted_returns",
    "entropy_from_logits",
    "gae",
    "grpo_advantages",
    "kl_penalty",
    "kl_reward_penalty",
    "masked_mean",
    "masked_sum",
    "masked_var",
    "masked_whiten",
    "place_at_last_token",
    "ppo_policy_loss",
    "rollout_correction_weights",
    "value_loss",
]
