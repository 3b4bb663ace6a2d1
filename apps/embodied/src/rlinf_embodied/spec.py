"""From the app config to the flow's `EmbodiedSpec`: worker configs and network shapes.

The policy's input and output shapes come from the task itself: one simulator is built in
the driver (state observations, or rendered frames for pixel policies), its observation and
action spaces read, and closed again, before any worker starts. A task that cannot be built
here fails here, with the simulator's own error.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import gymnasium as gym
import numpy as np

from rlinf.workers.embodied.actor import EmbodiedActorConfig
from rlinf.workers.embodied.pretrained_vla import PretrainedVLAConfig
from rlinf.workers.embodied.vla import VLAConfig
from rlinf.workers.embodied.vla_policy import VLAPolicyConfig
from rlinf.workers.env.config import EnvWorkerConfig
from rlinf.workers.models.policy import PolicyConfig as NetworkConfig
from rlinf.workers.runtime import HostAllocator
from rlinf_embodied.config import AppConfig, EnvConfig
from rlinf_embodied.errors import AppConfigError

if TYPE_CHECKING:
    from rlinf_embodied.workflow import EmbodiedSpec

__all__ = [
    "actor_config",
    "build_spec",
    "env_worker_config",
    "policy_config",
    "probe_spaces",
    "resets_every_iteration",
]


def env_worker_config(cfg: AppConfig) -> EnvWorkerConfig:
    """The env workers' config: task, env count, stage groups, GRPO same-start blocks."""
    env = cfg.env
    backend, task = env.backend, env.task
    grpo = cfg.algorithm.name == "grpo"
    return EnvWorkerConfig(
        env_name=task, num_envs=env.num_envs, pipeline_stages=env.pipeline_stages,
        seed=cfg.run.seed, max_episode_steps=env.max_episode_steps,
        same_start_group_size=cfg.algorithm.grpo_group_size if grpo else 1,
        pixels=(env.image_size, env.image_size) if env.obs == "pixels" else None,
        instruction=env.instruction, threads=env.threads, processes=env.processes,
        concurrent_groups=env.concurrent_groups,
        env_kwargs=_env_kwargs(backend, env))


def _env_kwargs(backend: str, env: EnvConfig) -> dict[str, Any]:
    """The backend's constructor options the config sets."""
    if backend == "libero":
        return {"render_effects": env.render_effects}
    if backend == "maniskill" and env.control_mode is not None:
        return {"control_mode": env.control_mode}
    return {}


def probe_spaces(env_cfg: EnvWorkerConfig) -> tuple[gym.Space[Any], gym.Space[Any], str]:
    """Observation and action space of one env of `env_cfg` and the instruction a VLA reads
    (`EnvWorker.instruction`), from one env worker built and closed here."""
    from rlinf_embodied.workflow import probe

    with probe(env_cfg) as worker:
        return worker.observation_space, worker.action_space, worker.instruction


def _action_shape(space: gym.Space[Any], env_id: str) -> tuple[int, bool]:
    if isinstance(space, gym.spaces.Discrete):
        return int(space.n), True
    if isinstance(space, gym.spaces.Box) and len(space.shape) == 1:
        return int(space.shape[0]), False
    raise AppConfigError("env.id", env_id, f"a task with a Discrete or 1-d Box action space, "
                         f"got {space}")


def policy_config(cfg: AppConfig, obs_space: gym.Space[Any], action_space: gym.Space[Any],
                  instruction: str = "") -> NetworkConfig | VLAPolicyConfig:
    """The network of `cfg.policy` sized for the task's spaces; a VLA reads `instruction`
    (`probe_spaces`'), else `cfg.env.instruction`, else the task id."""
    pol = cfg.policy
    if not isinstance(obs_space, gym.spaces.Box):
        raise AppConfigError("env.id", cfg.env.id, f"a task with array observations, got "
                             f"{obs_space}")
    action_dim, discrete = _action_shape(action_space, cfg.env.id)
    if pol.kind != "vla":
        return NetworkConfig(obs_shape=tuple(int(d) for d in obs_space.shape),
                             action_dim=action_dim, discrete=discrete,
                             hidden_sizes=pol.hidden_sizes, cnn_channels=pol.cnn_channels,
                             init_log_std=pol.init_log_std)
    if discrete or not isinstance(action_space, gym.spaces.Box):
        raise AppConfigError("policy.kind", "vla", "'mlp' or 'cnn' for a discrete-action task "
                             "(the VLA decodes continuous action bins)")
    low, high = np.asarray(action_space.low, float), np.asarray(action_space.high, float)
    if not (np.isfinite(low).all() and np.isfinite(high).all()):
        raise AppConfigError("policy.kind", "vla", "a task with a bounded action box for "
                             "the VLA's action bins")
    v = pol.vla
    image_shape = (int(obs_space.shape[0]), cfg.env.image_size, cfg.env.image_size)
    network: VLAConfig | PretrainedVLAConfig
    if v.pretrained:
        if image_shape[0] % 3 or v.camera >= image_shape[0] // 3:
            raise AppConfigError("policy.vla.camera", v.camera,
                                 f"one of the {image_shape[0] // 3} RGB cameras of the task's "
                                 f"{image_shape[0]}-channel frames")
        network = PretrainedVLAConfig(
            path=v.pretrained, image_shape=image_shape, action_dim=action_dim,
            num_bins=v.num_bins, camera=v.camera, prompt=v.prompt, dtype=v.dtype,
            trust_remote_code=v.trust_remote_code)
    else:
        network = VLAConfig(
            image_shape=image_shape, action_dim=action_dim, num_bins=v.num_bins,
            patch_size=v.patch_size, max_instruction_tokens=v.max_instruction_tokens,
            hidden_size=v.hidden_size, num_layers=v.num_layers, num_heads=v.num_heads)
    task = cfg.env.task
    return VLAPolicyConfig(vla=network, action_low=tuple(low.tolist()),
                           action_high=tuple(high.tolist()),
                           instruction=instruction or cfg.env.instruction or task)


def actor_config(cfg: AppConfig, policy: NetworkConfig | VLAPolicyConfig) -> EmbodiedActorConfig:
    """The actor's training config from `cfg.algorithm`."""
    a = cfg.algorithm
    return EmbodiedActorConfig(
        policy=policy, algorithm=a.name, seed=cfg.run.seed, lr=a.lr, gamma=a.gamma,
        gae_lambda=a.gae_lambda, clip_ratio=a.clip_ratio, value_clip=a.value_clip,
        value_coef=a.value_coef, entropy_coef=a.entropy_coef, max_grad_norm=a.max_grad_norm,
        epochs=a.epochs, num_minibatches=a.num_minibatches,
        normalize_advantages=a.normalize_advantages, grpo_group_size=a.grpo_group_size,
        policy_lag=a.policy_lag, max_importance_weight=a.max_importance_weight)


def build_spec(cfg: AppConfig) -> EmbodiedSpec:
    """The flow's spec for `cfg` (builds one simulator to read the task's shapes)."""
    from rlinf_embodied.workflow import EmbodiedSpec

    env = env_worker_config(cfg)
    obs_space, action_space, instruction = probe_spaces(env)
    policy = policy_config(cfg, obs_space, action_space, instruction)
    return EmbodiedSpec(env=env, policy=policy, actor=actor_config(cfg, policy),
                        rollout_steps=cfg.run.rollout_steps, seed=cfg.run.seed,
                        device=cfg.run.device,
                        host_allocator=HostAllocator(cfg.run.host_allocator),
                        reset_every_iteration=resets_every_iteration(cfg))


def resets_every_iteration(cfg: AppConfig) -> bool:
    """Whether every iteration starts from fresh seeded resets: GRPO compares each env's
    first episode of a rollout, and the simulator state of ManiSkill3, LIBERO and envs in
    other processes cannot be checkpointed (a resumed run must not depend on it)."""
    backend = cfg.env.backend
    return (cfg.algorithm.name == "grpo" or backend in ("maniskill", "libero")
            or cfg.env.processes > 1)
