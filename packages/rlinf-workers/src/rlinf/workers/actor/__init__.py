"""The training worker: GRPO/PPO on rollout batches with DDP or FSDP2, LoRA adapters,
checkpoints, offload."""

from rlinf.workers.actor.config import ActorConfig, Algorithm, Parallelism
from rlinf.workers.actor.critic import TokenValueModel, build_critic_from_policy
from rlinf.workers.actor.lora import LoraConfig, LoraMerger
from rlinf.workers.actor.worker import PolicyTrainer

__all__ = [
    "ActorConfig",
    "Algorithm",
    "LoraConfig",
    "LoraMerger",
    "Parallelism",
    "PolicyTrainer",
    "TokenValueModel",
    "build_critic_from_policy",
]
