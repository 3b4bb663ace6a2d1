"""The reasoning macro flow's roles: Ray workers wrapping rollout, reward, inference, actor.

Each role is a `rlinf.workers.flow.FlowWorker` with one flow entry method (`rollout_step`,
`reward_step`, `inference_step`, `train_step`), so a `rlinf.workers.flow.MacroFlow` declares
and runs them in any placement. Groups stream between roles through the flow's channels
(`pack_group`), every role holds its devices while it computes (`FlowWorker.turn`) so
collocated roles take turns, and the actor's weights reach the rollout and inference roles
over the transport the placement implies (`WeightSenderRole` / `WeightReceiverRole`). The
reasoning app and ``examples/ppo_critic_math.py`` declare flows of them.

Names are imported from their module on first use (`rlinf.workers._lazy`): each role's Ray
process imports only its own module (a reward process never loads the actor's trainer).
On one machine, `RANK_MODULES` are imported once by the server every worker process is
forked from (`rlinf.workers.runtime.local`), so no process imports them again.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from rlinf.workers._lazy import lazy_attribute

if TYPE_CHECKING:
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
    from rlinf.workers.reasoning.setup import ModelFactory, RoleSetup, TokenizerFactory, draw_seed
    from rlinf.workers.reasoning.sync import BucketLayout, WeightReceiverRole, WeightSenderRole

RANK_MODULES: tuple[str, ...] = (
    "rlinf.workers.models.causal_lm", "rlinf.workers.reasoning.rollout",
    "rlinf.workers.reasoning.reward", "rlinf.workers.reasoning.inference",
    "rlinf.workers.reasoning.actor",
)
"""What the roles' worker processes import: the model code and every role."""

_LAZY = {
    "ActorRole": "actor", "ReasoningRole": "base", "MicroBatches": "groups",
    "pack_group": "groups", "unpack_group": "groups", "InferenceRole": "inference",
    "RewardRole": "reward", "EngineName": "rollout", "ProblemBatches": "rollout",
    "ProblemSource": "rollout", "RolloutRole": "rollout", "build_engine": "rollout",
    "ModelFactory": "setup", "RoleSetup": "setup", "TokenizerFactory": "setup",
    "draw_seed": "setup",
    "BucketLayout": "sync", "WeightReceiverRole": "sync", "WeightSenderRole": "sync",
}


def __getattr__(name: str) -> Any:
    return lazy_attribute(__name__, _LAZY, name)


__all__ = [
    "RANK_MODULES",
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
    "TokenizerFactory",
    "WeightReceiverRole",
    "WeightSenderRole",
    "build_engine",
    "draw_seed",
    "pack_group",
    "unpack_group",
]
