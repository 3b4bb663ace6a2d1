"""The reasoning macro flow's roles: Ray workers wrapping rollout, reward, inference, actor.

Each role is a `rlinf.workers.runtime.Worker` (launch it with `WorkerGroup.launch`). Groups
stream between roles through `rlinf.comm` channels keyed by consumer rank (`Routing`), every
role holds its devices while it computes (`ReasoningRole.turn`) so collocated roles take
turns, and the actor's weights reach the rollout and inference roles over the transport the
placement implies (`WeightSenderRole` / `WeightReceiverRole`). The driver that wires them is
the app's `ReasoningFlow`.
"""

from rlinf.workers.reasoning.actor import ActorRole
from rlinf.workers.reasoning.base import ReasoningRole
from rlinf.workers.reasoning.inference import InferenceRole
from rlinf.workers.reasoning.reward import RewardRole
from rlinf.workers.reasoning.rollout import EngineName, RolloutRole, build_engine
from rlinf.workers.reasoning.routing import Routing, pack_group, rank_key, unpack_group
from rlinf.workers.reasoning.setup import ModelFactory, RoleSetup, draw_seed
from rlinf.workers.reasoning.sync import BucketLayout, WeightReceiverRole, WeightSenderRole

__all__ = [
    "ActorRole",
    "BucketLayout",
    "EngineName",
    "InferenceRole",
    "ModelFactory",
    "ReasoningRole",
    "RewardRole",
    "RoleSetup",
    "RolloutRole",
    "Routing",
    "WeightReceiverRole",
    "WeightSenderRole",
    "build_engine",
    "draw_seed",
    "pack_group",
    "rank_key",
    "unpack_group",
]
