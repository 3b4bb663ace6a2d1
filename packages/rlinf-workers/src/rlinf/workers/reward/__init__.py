"""Rewards of responses: the built-in math verifier and users' reward functions, weighted."""

from rlinf.workers.reward.functions import (
    BUILTIN_MATH,
    RewardSample,
    RewardShape,
    RewardTerm,
    load_reward_function,
    load_reward_terms,
    reward_shape,
)
from rlinf.workers.reward.worker import (
    RewardConfig,
    RewardScorer,
    RewardStats,
    call_reward_function,
    check_reward_function,
)

__all__ = [
    "BUILTIN_MATH",
    "RewardConfig",
    "RewardSample",
    "RewardScorer",
    "RewardShape",
    "RewardStats",
    "RewardTerm",
    "call_reward_function",
    "check_reward_function",
    "load_reward_function",
    "load_reward_terms",
    "reward_shape",
]
