"""Rule-based rewards for math responses, or a user's reward function."""

from rlinf.workers.reward.worker import (
    RewardConfig,
    RewardFunction,
    RewardStats,
    RewardWorker,
    call_reward_function,
    load_reward_function,
)

__all__ = ["RewardConfig", "RewardFunction", "RewardStats", "RewardWorker",
           "call_reward_function", "load_reward_function"]
