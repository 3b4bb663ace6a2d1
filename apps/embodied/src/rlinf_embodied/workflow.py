"""The embodied workflow, declared once: what the planner prices and what the runtime runs.

`EmbodiedSpec` is everything a run trains. `declare` turns it into the `MacroFlow` the
runtime (`rlinf.workers.flow.FlowRun`) launches: three components on the embodied roles —
``env`` (`EnvRole.rollout`), ``rollout`` (`PolicyRole.serve`, which runs inside the env's
process wherever a plan co-places them: `ComponentSpec.inline_with`) and ``actor``
(`EmbodiedActorRole.train_step`, one process over its devices) — the env ↔ rollout loop of
``rollout_steps`` steps over p2p edges, the trajectory channel env → actor, and the weight
sync actor → rollout. `embodied_workflow(spec)` is the same declaration as the planner sees
it (`MacroFlow.to_sched_workflow`).
"""

from __future__ import annotations

import contextlib
import math
from collections.abc import Iterator
from dataclasses import dataclass, replace
from typing import Literal

import numpy as np

from rlinf.sched import Component, Edge, ExecutionPlan, Loop, Workflow, parse_placement
from rlinf.workers.embodied.actor import EmbodiedActorConfig
from rlinf.workers.embodied.roles import (
    EmbodiedActorRole,
    EnvDescription,
    EnvRole,
    PolicyRole,
    describe_env,
)
from rlinf.workers.embodied.rollout import PolicyRolloutConfig
from rlinf.workers.embodied.vla_policy import (
    VLANetworkConfig,
    VLAPolicyConfig,
    VLARolloutConfig,
)
from rlinf.workers.env import EnvWorker, EnvWorkerConfig
from rlinf.workers.errors import ConfigError
from rlinf.workers.flow import ChannelSpec, ComponentSpec, MacroFlow, WeightSyncSpec
from rlinf.workers.flow.channels import ChannelTransport
from rlinf.workers.models.policy import PolicyConfig
from rlinf.workers.runtime import DEFAULT_ALLOCATOR, HostAllocator, WorkerContext

__all__ = [
    "COMPONENTS",
    "EmbodiedSpec",
    "declare",
    "describe",
    "embodied_workflow",
    "fixed_plan",
    "policy_configs",
    "probe",
    "stages_of",
]

COMPONENTS = ("env", "rollout", "actor")
"""Workflow components: simulators, rollout inference, training."""


@dataclass(frozen=True)
class EmbodiedSpec:
    """Everything an embodied run trains (the app builds it from its Hydra config)."""

    env: EnvWorkerConfig
    """Task, number of envs, seed, time limit, stage groups (`pipeline_stages`), pixels."""
    policy: PolicyConfig | VLANetworkConfig | VLAPolicyConfig
    """MLP/CNN actor-critic, or an OpenVLA-style VLA (needs ``env.pixels``), tiny
    (`VLAConfig`) or pretrained (`PretrainedVLAConfig`): a bare network config gets the task's
    action box and instruction at launch, a `VLAPolicyConfig` brings its own."""
    actor: EmbodiedActorConfig
    """PPO/GRPO hyper-parameters; its `policy` and `seed` are filled in from this spec."""
    rollout_steps: int
    """Env steps per env per iteration."""
    seed: int = 0
    """Seeds the initial weights, the sampling streams and the actor's shuffling."""
    device: Literal["cpu", "cuda"] = "cpu"
    """Where policy and actor compute; simulators always run on the CPU."""
    reset_every_iteration: bool = False
    """Start every iteration from resets seeded by (env seed, step) instead of continuing
    open episodes (GRPO samples; resumable on backends whose state cannot be saved)."""
    torch_threads: int | None = None
    """Torch threads per role (None: the role's device count)."""
    link_timeout: float = 120.0
    """Seconds a rollout waits for one micro-batch before failing (dead or stuck peer); the
    trainer waits for a whole rollout, `rollout_timeout`."""
    host_allocator: HostAllocator = DEFAULT_ALLOCATOR
    """The workers' ``malloc`` (`rlinf.workers.runtime.allocator`)."""
    link_transport: ChannelTransport = "p2p"
    """How env and policy processes exchange micro-batches: rlinf.comm point-to-point
    messages (one per micro-batch) or channels owned by the receiver (`ChannelSpec`)."""

    def __post_init__(self) -> None:
        if self.rollout_steps < 1:
            raise ConfigError(f"rollout_steps must be >= 1, got {self.rollout_steps}")
        if self.device not in ("cpu", "cuda"):
            raise ConfigError(f"device must be 'cpu' or 'cuda', got {self.device!r}")
        if isinstance(self.policy, VLANetworkConfig | VLAPolicyConfig):
            vla = _network(self.policy)
            pixels = self.env.pixels
            if pixels is None or vla.image_shape[1:] != tuple(pixels):
                raise ConfigError(
                    f"a VLA policy sees camera frames: set env.pixels to the (height, width) "
                    f"of the VLA's image_shape={vla.image_shape}, got env.pixels={pixels}")
        elif not isinstance(self.policy, PolicyConfig):
            raise ConfigError(f"policy must be a PolicyConfig, VLAConfig, PretrainedVLAConfig or "
                              f"VLAPolicyConfig, got {type(self.policy).__name__}")
        if self.actor.algorithm == "grpo" and not self.reset_every_iteration:
            raise ConfigError("GRPO compares each env's first episode of a rollout: set "
                              "reset_every_iteration=True")

    @property
    def rollout_timeout(self) -> float:
        """Seconds the trainer waits for an iteration's trajectory: a micro-batch's bound for
        every step (a LIBERO episode of 220 steps outlasted a fixed bound)."""
        return self.link_timeout * (self.rollout_steps + 2)

    @property
    def samples_per_iteration(self) -> int:
        """Env steps (training samples) per iteration."""
        return self.env.num_envs * self.rollout_steps


def _network(policy: VLANetworkConfig | VLAPolicyConfig) -> VLANetworkConfig:
    return policy.vla if isinstance(policy, VLAPolicyConfig) else policy


def _obs_bytes(spec: EmbodiedSpec) -> int:
    if isinstance(spec.policy, VLANetworkConfig | VLAPolicyConfig):
        return int(np.prod(_network(spec.policy).image_shape))  # uint8 frames
    return 4 * int(np.prod(spec.policy.obs_shape))


def _components(spec: EmbodiedSpec) -> tuple[tuple[Component, ...], tuple[Edge, ...]]:
    """What the planner prices. Env and rollout run one process per device: env workers
    that split every stage group evenly (`split_evenly`: the device count divides the
    micro-batch; `EnvWorkerConfig.shard`) and policy processes that each serve whole env
    workers (`devices_divide`); the actor's one process uses one thread per device. The
    env's micro-batch is a stage group, so it divides ``num_envs``; the policy serves the
    same stage groups; the actor trains once on the whole rollout. Which of them share a
    process the runtime decides per placement (`rlinf.workers.flow.MacroFlow.isolated_under`):
    on one device env, its inline policy and the actor run in one process; an actor spanning
    several devices, and env and policy over a p2p link, have processes of their own."""
    n = spec.env.num_envs
    obs = _obs_bytes(spec)
    return ((Component("env", kind="env", resource="cpu", batch=n, micro_batch_divides=True,
                       split_evenly=True),
             Component("rollout", kind="rollout", resource="cpu", batch=n,
                       same_micro_batch_as="env", split_evenly=True, devices_divide="env"),
             Component("actor", kind="actor", resource="cpu", batch=spec.samples_per_iteration,
                       whole_batch=True)),
            (Edge("env", "rollout", bytes_per_item=2 * obs + 16),  # obs, final obs, index
             Edge("rollout", "env", bytes_per_item=16, feedback=True),
             Edge("env", "actor", bytes_per_item=obs + 32)))


def embodied_workflow(spec: EmbodiedSpec) -> Workflow:
    """The macro flow as the planner prices it: env ↔ rollout loop of `rollout_steps` steps
    over ``num_envs`` items, then the actor over every sample. Placement devices are CPU
    slots (every component a ``cpu`` resource); with ``device="cuda"`` the policy and actor
    processes also share the machine's GPU, which the profile's measured times carry."""
    components, edges = _components(spec)
    if spec.actor.policy_lag:  # the actor trains the previous rollout (see `declare`)
        edges = tuple(replace(e, lagged=True) if e.dst == "actor" else e for e in edges)
    return Workflow(components, edges, global_batch=spec.env.num_envs,
                    loops=(Loop(("env", "rollout"), spec.rollout_steps),),
                    name=f"embodied-{spec.env.env_name}")


def declare(spec: EmbodiedSpec, *, stages: int, rollout: PolicyRolloutConfig | VLARolloutConfig,
            actor: EmbodiedActorConfig) -> MacroFlow:
    """The `MacroFlow` the runtime launches, its env split into `stages` stage groups (the
    plan's env micro-batch: `stages_of`), with the policy and actor configs shaped for the
    task (`policy_configs`)."""
    components, edges = _components(spec)
    env, policy, trainer = components
    common = {"num_threads": spec.torch_threads, "io_timeout": spec.link_timeout}
    gpus = 0.5 if spec.device == "cuda" else None  # policy and actor share the one GPU
    env_config = replace(spec.env, pipeline_stages=stages)
    loop = spec.link_transport
    return MacroFlow(
        components=(
            ComponentSpec(env, EnvRole, entry="rollout", init_kwargs={
                "config": env_config, "reset_every_iteration": spec.reset_every_iteration,
                **common}),
            ComponentSpec(policy, PolicyRole, entry="serve",
                          init_kwargs={"config": rollout, **common,
                                       "concurrent_stages": (env_config.processes > 1
                                                             and env_config.concurrent_groups)},
                          num_gpus=gpus,
                          inline_with="env", inline_kwargs={"policy": rollout}),
            ComponentSpec(trainer, EmbodiedActorRole, entry="train_step",
                          init_kwargs={"config": actor, **common,
                                       "io_timeout": spec.rollout_timeout},
                          num_gpus=gpus, one_process=True)),
        channels=(ChannelSpec(edges[0], transport=loop), ChannelSpec(edges[1], transport=loop),
                  ChannelSpec(edges[2])),
        weight_syncs=(WeightSyncSpec("actor", ("rollout",)),),
        loops=(Loop(("env", "rollout"), spec.rollout_steps),),
        global_batch=spec.env.num_envs, name=f"embodied-{spec.env.env_name}",
        policy_lag=spec.actor.policy_lag, host_allocator=spec.host_allocator)


_FIXED_SPECS = {
    "collocated": "env, rollout, actor: 0",
    "hybrid": "env: 0, rollout: 1, actor: 0-1",
    "disaggregated": "env: 0, rollout: 1, actor: 2",
}


def fixed_plan(spec: EmbodiedSpec, mode: str, *, num_devices: int = 2) -> ExecutionPlan:
    """The plan of a named mode, unpriced (``predicted_time`` NaN), stage groups from
    ``spec.env.pipeline_stages``: ``collocated`` (everything on device 0, env and policy
    take turns), ``hybrid`` (env on 0, rollout on 1, actor on 0-1) or ``disaggregated``
    (one device each; needs 3). Any placement spec over env/rollout/actor works too."""
    text = _FIXED_SPECS.get(mode, mode)
    placement = parse_placement(text, components=COMPONENTS, num_devices=num_devices)
    if not placement.components:
        raise ConfigError(f"placement {mode!r} names no devices: plan it first (rlinf.sched.plan "
                          "over flow.measure(...)) and launch the chosen plan")
    micro = spec.env.num_envs // spec.env.pipeline_stages
    return ExecutionPlan(
        placement=placement,
        micro_batch={"env": micro, "rollout": micro, "actor": spec.samples_per_iteration},
        granularity={"env->rollout": micro, "rollout->env": micro,
                     "env->actor": spec.samples_per_iteration},
        predicted_time=math.nan, utilisation=math.nan, label=mode)


def stages_of(spec: EmbodiedSpec, plan: ExecutionPlan) -> int:
    """The stage groups `plan` runs: ``num_envs`` over its env micro-batch (must divide)."""
    n = spec.env.num_envs
    micro = int(plan.micro_batch.get("env", n // spec.env.pipeline_stages))
    if micro < 1 or n % micro:
        raise ConfigError(f"plan micro-batch {micro} for env must divide num_envs={n}")
    return n // micro


@contextlib.contextmanager
def probe(env: EnvWorkerConfig) -> Iterator[EnvWorker]:
    """An env worker of one env of `env`, in this process, shut down on exit (to read the
    task's spaces and instruction)."""
    worker = EnvWorker(WorkerContext(role="probe", rank=0, world_size=1),
                       config=replace(env, num_envs=1, pipeline_stages=1, processes=1,
                                      same_start_group_size=1, threads=1))
    try:
        yield worker
    finally:
        worker.shutdown()


def describe(spec: EmbodiedSpec) -> EnvDescription:
    """The task's spaces and instruction, from one env built and closed in this process."""
    with probe(spec.env) as worker:
        return describe_env(worker)


def policy_configs(spec: EmbodiedSpec, desc: EnvDescription
                    ) -> tuple[PolicyRolloutConfig | VLARolloutConfig, EmbodiedActorConfig]:
    if isinstance(spec.policy, VLANetworkConfig | VLAPolicyConfig):
        network = _network(spec.policy)
        if desc.discrete_actions is not None or len(desc.action_low) != network.action_dim:
            raise ConfigError(f"the VLA's action_dim={network.action_dim} but "
                              f"{spec.env.env_name!r} has action shape {desc.action_shape} "
                              f"(discrete: {desc.discrete_actions}); the VLA needs a box")
        vla = spec.policy if isinstance(spec.policy, VLAPolicyConfig) else VLAPolicyConfig(
            vla=network, action_low=desc.action_low, action_high=desc.action_high,
            instruction=desc.instruction)
        rollout: PolicyRolloutConfig | VLARolloutConfig = VLARolloutConfig(
            policy=vla, seed=spec.seed, device=spec.device)
        return rollout, replace(spec.actor, policy=vla, seed=spec.seed, device=spec.device)
    policy = spec.policy
    if tuple(policy.obs_shape) != desc.obs_shape:
        raise ConfigError(f"PolicyConfig.obs_shape={policy.obs_shape} but {spec.env.env_name!r} "
                          f"observes {desc.obs_shape}: set obs_shape to match")
    want = desc.discrete_actions if policy.discrete else int(np.prod(desc.action_shape))
    if policy.discrete != (desc.discrete_actions is not None) or policy.action_dim != want:
        raise ConfigError(f"PolicyConfig(action_dim={policy.action_dim}, discrete="
                          f"{policy.discrete}) does not fit {spec.env.env_name!r}'s actions "
                          f"(shape {desc.action_shape}, discrete: {desc.discrete_actions})")
    return (PolicyRolloutConfig(policy=policy, seed=spec.seed, device=spec.device),
            replace(spec.actor, policy=policy, seed=spec.seed, device=spec.device))
