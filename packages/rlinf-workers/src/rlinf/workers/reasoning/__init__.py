"""The reasoning macro flow's roles: Ray workers wrapping rollout, reward, inference, actor.

Each role is a `rlinf.workers.flow.FlowWorker` with one flow entry method (`rollout_step`,
`reward_step`, `inference_step`, `train_step`), so a `rlinf.workers.flow.MacroFlow` declares
and runs them in any placement. Groups stream between roles through the flow's channels
(`pack_group`), every role holds its devices while it computes (`FlowWorker.turn`) so
collocated roles take turns, and the actor's weights reach the rollout and inference roles
over the transport the placement implies (`WeightSenderRole` / `WeightReceiverRole`). The
reasoning app and ``examples/ppo_critic_math.py`` declare flows of them.
"""

from rlinf.workers.reasoning.actor import ActorRole
from rlinf.workers.reasoning.base import ReasoningRole
from rlinf.workers.reasoning.groups import MicroBatches, pack_group, unpack_group
from rlinf.workers.reasoning.inference import InferenceRole
from rlinf.workers.reasoning.reward import RewardRole
from rlinf.workers.reasoning.rollout import (
    EngineName,
    ProblemBatches,
    ProblemSource,
    RolloutRole,
    build_engine,
)
from rlinf.workers.reasoning.setup import ModelFactory, RoleSetup, draw_seed
from rlinf.workers.reasoning.sync import BucketLayout, WeightReceiverRole, WeightSenderRole

__all__ = [
    "ActorRole",
    "BucketLayout",
    "EngineName",
    "InferenceRole",
    "MicroBatches",
    "ModelFactory",
    "ProblemBatches",
    "ProblemSource",
    "ReasoningRole",
    "RewardRole",
    "RoleSetup",
    "RolloutRole",
    "WeightReceiverRole",
    "WeightSenderRole",
    "build_engine",
    "draw_seed",
    "pack_group",
    "unpack_group",
]
