"""Embodied roles: the env, rollout-policy and actor components of an embodied macro flow.

- `EnvRole` runs an `EnvWorker`; its entry runs the env ↔ policy loop of an iteration,
  over the loop's edges to a `PolicyRole` (stage groups pipelined across the two
  processes) or with the policy inline where the plan co-places them (they take turns),
  then puts the trajectory into the trainer's channel.
- `PolicyRole` serves rollout inference (MLP/CNN or the tiny VLA).
- `EmbodiedActorRole` trains (PPO/GRPO), checkpoints with every RNG and sends weights through the
  runtime's weight sync (`rlinf.workers.flow.WeightSender`; the policy roles receive).

Every role is a `rlinf.workers.flow.FlowWorker` computing on one CPU thread per device of
its rank (``num_threads`` overrides): it records spans and holds its devices through the
device lock in each `turn` when the flow has one (roles placed together take turns).
Weights travel as `weights.py` says.
"""

from rlinf.workers.embodied.roles.actor_role import (
    EmbodiedActorRole,
    TrainReport,
    receive_trajectory,
)
from rlinf.workers.embodied.roles.env_role import (
    EnvDescription,
    EnvRole,
    RolloutReport,
    describe_env,
    episode_means,
    pool_rollout_metrics,
    rollout_metrics,
)
from rlinf.workers.embodied.roles.policy_role import (
    PolicyRole,
    RolloutPolicy,
    build_rollout_policy,
    serve_stages,
)
from rlinf.workers.embodied.roles.weights import (
    PolicyTarget,
    Weights,
    weights_from_wire,
    weights_to_wire,
)

__all__ = [
    "EmbodiedActorRole",
    "EnvDescription",
    "EnvRole",
    "PolicyRole",
    "PolicyTarget",
    "RolloutPolicy",
    "RolloutReport",
    "TrainReport",
    "Weights",
    "build_rollout_policy",
    "describe_env",
    "episode_means",
    "pool_rollout_metrics",
    "receive_trajectory",
    "rollout_metrics",
    "serve_stages",
    "weights_from_wire",
    "weights_to_wire",
]
