"""Embodied RL workers: the policy rollout worker, the PPO/GRPO actor, their flow roles.

- `PolicyRolloutWorker` answers the env worker's observation micro-batches (one per
  pipeline stage) with actions, log-probs and values; per-env sampling streams keep
  trajectories independent of the stage grouping.
- `EmbodiedActorWorker` trains the actor-critic on rollouts (PPO with GAE, or GRPO over
  blocks of episodes from identical start states) and checkpoints model, optimizer and RNG.
- `vla.TinyVLA`: image + instruction → discretised action tokens (OpenVLA style) through a
  tiny Qwen2 built from a config, with `act`/`evaluate` and a value head.
- `pretrained_vla.PretrainedVLA`: a Hugging Face image-text-to-text checkpoint from a local
  folder decoding OpenVLA's action tokens, with the same `act`/`evaluate`.
- `vla_policy`: either VLA behind the same protocol (`VLARolloutWorker`) and the PPO actor
  (`VLAActorCritic`, `VLAPolicyConfig` with the env's action box and instruction).
- `roles`: `EnvRole`, `PolicyRole`, `EmbodiedActorRole` — the workers as Ray actors of the app's
  macro flow (env ↔ policy over rlinf.comm, stage groups pipelined across processes).
- `profiling.measure_components`: per-component profile for the planner.
"""

from rlinf.workers.embodied.actor import EmbodiedActorConfig, EmbodiedActorWorker
from rlinf.workers.embodied.rollout import PolicyRolloutConfig, PolicyRolloutWorker

__all__ = [
    "EmbodiedActorConfig",
    "EmbodiedActorWorker",
    "PolicyRolloutConfig",
    "PolicyRolloutWorker",
]
