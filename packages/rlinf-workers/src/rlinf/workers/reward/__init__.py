"""Rule-based rewards for math responses."""

from rlinf.workers.reward.worker import RewardConfig, RewardStats, RewardWorker

__all__ = ["RewardConfig", "RewardStats", "RewardWorker"]
