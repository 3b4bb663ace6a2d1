"""The Megatron actor backend (``actor.backend=megatron``, extra ``rlinf-workers[megatron]``):
a megatron-core GPT cut by tensor, pipeline and data parallelism, trained with the same
GRPO and PPO losses as the other backends (PPO's critic cut like the policy) and synced to
the rollout in Hugging Face layout.

megatron-core is imported only when an actor is built, so this package imports without it.
"""

from rlinf.workers.actor.megatron.convert import (
    hf_policy_from_checkpoint,
    hf_to_megatron,
    megatron_to_hf,
    shards_to_hf,
)
from rlinf.workers.actor.megatron.distributed_optimizer import DistributedAdamW
from rlinf.workers.actor.megatron.layout import MegatronConfig, ModelShape
from rlinf.workers.actor.megatron.trainer import MegatronActor

__all__ = ["DistributedAdamW", "MegatronActor", "MegatronConfig", "ModelShape",
           "hf_policy_from_checkpoint", "hf_to_megatron", "megatron_to_hf", "shards_to_hf"]
