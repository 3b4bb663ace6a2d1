"""Embodied roles: the env, rollout-policy and actor workers as Ray actors of a macro flow.

- `EnvRole` runs an `EnvWorker`; observations out and actions in through rlinf.comm
  channels (`RoleLink`) to a `PolicyRole`, stage groups pipelined across the two processes,
  or with the policy inline when env and policy are collocated (they take turns).
- `PolicyRole` serves rollout inference (MLP/CNN or the tiny VLA).
- `ActorRole` trains (PPO/GRPO), checkpoints with every RNG and hands out weights.

Every role is a `rlinf.workers.flow.FlowWorker` (`RoleBase`): it sets torch's threads to its
device count, records spans, holds its devices through the device lock in each `turn` when
the flow configured one (roles placed together take turns), and receives trajectories and
weights over channels it owns, never through the driver.
"""

from rlinf.workers.embodied.roles.actor_role import ActorRole, TrainReport
from rlinf.workers.embodied.roles.base import (
    RoleBase,
    Weights,
    weights_from_wire,
    weights_to_wire,
)
from rlinf.workers.embodied.roles.env_role import (
    EnvDescription,
    EnvRole,
    RolloutReport,
    describe_env,
)
from rlinf.workers.embodied.roles.link import LinkEnds, RoleLink, open_channels, open_link
from rlinf.workers.embodied.roles.peer import PeerLink
from rlinf.workers.embodied.roles.policy_role import (
    PolicyRole,
    RolloutPolicy,
    build_rollout_policy,
    serve_stages,
)

__all__ = [
    "ActorRole",
    "EnvDescription",
    "EnvRole",
    "LinkEnds",
    "PeerLink",
    "PolicyRole",
    "RoleBase",
    "RoleLink",
    "RolloutPolicy",
    "RolloutReport",
    "TrainReport",
    "Weights",
    "build_rollout_policy",
    "describe_env",
    "open_channels",
    "open_link",
    "serve_stages",
    "weights_from_wire",
    "weights_to_wire",
]
