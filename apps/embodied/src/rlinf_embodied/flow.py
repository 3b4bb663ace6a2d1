"""The embodied macro flow: env, rollout and actor workers placed by an `ExecutionPlan`.

One iteration (`EmbodiedFlow.step`) is rollout → `actor.train` → weight sync:

- **env and rollout share a device** (collocated placements): one `EnvRole` process runs
  the simulators and the policy inline; they take turns, each observation batch answered at
  once, no transport. The actor trains in its own process on its devices afterwards.
- **env and rollout on different devices** (hybrid, disaggregated): an `EnvRole` and a
  `PolicyRole` in two processes exchange stage-group micro-batches through rlinf.comm
  channels; while the policy computes the actions of group g+1 the env steps group g.
  The plan's env micro-batch sets the stage groups (``num_envs / micro_batch["env"]``).

Each component is one Ray worker (one rank) on its placement's devices, with one torch
thread per device; on a CPU cluster a device is a core slot. Roles hold the device lock
while computing, so components placed on the same devices take turns. Pipelining changes
only the schedule: with the same seed and stage groups every placement produces identical
trajectories and metrics (tested).

Resuming: `save` writes the actor (model, optimizer, shuffling generator, step, global
RNGs), the rollout policy's sampling streams, and the simulators' exact state (MuJoCo
integration state, each env's generator, time-limit counters, open episodes' bookkeeping;
`rlinf.workers.env.state`), so a loaded flow continues the same trajectory. Backends whose
state cannot be captured (ManiSkill3, LIBERO) use ``reset_every_iteration=True``: every
iteration then starts from resets seeded by (seed, step) and needs no env state.
"""

from __future__ import annotations

import contextlib
import math
import time
import uuid
from collections.abc import Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, Literal

import numpy as np
import structlog
import torch

from rlinf.comm import Batch, new_token
from rlinf.envs.embodied import EpisodeStats
from rlinf.sched import (
    Cluster,
    Component,
    Edge,
    ExecutionPlan,
    Loop,
    Measurement,
    Profile,
    Workflow,
    parse_placement,
)
from rlinf.workers.embodied.actor import EmbodiedActorConfig
from rlinf.workers.embodied.profiling import measure_components
from rlinf.workers.embodied.roles import (
    ActorRole,
    EnvDescription,
    EnvRole,
    PolicyRole,
    RoleBase,
    RoleLink,
    RolloutReport,
    TrainReport,
    build_rollout_policy,
    describe_env,
    weights_from_wire,
)
from rlinf.workers.embodied.rollout import PolicyRolloutConfig
from rlinf.workers.embodied.vla import VLAConfig
from rlinf.workers.embodied.vla_policy import VLAPolicyConfig, VLARolloutConfig
from rlinf.workers.env import EnvWorker, EnvWorkerConfig
from rlinf.workers.errors import ConfigError, WorkersError
from rlinf.workers.flow import FlowChannel
from rlinf.workers.models.policy import PolicyConfig
from rlinf.workers.runtime import GroupFuture, WorkerContext, WorkerGroup, count_onloads
from rlinf.workers.telemetry import Span

__all__ = [
    "COMPONENTS",
    "EmbodiedFlow",
    "EmbodiedSpec",
    "EmbodiedStepResult",
    "EvalResult",
    "embodied_workflow",
    "fixed_plan",
]

_log = structlog.get_logger(__name__)

COMPONENTS = ("env", "rollout", "actor")
"""Workflow components: simulators, rollout inference, training."""
_FORMAT = "rlinf-embodied-flow/1"
_CPU_PER_RANK = 0.25  # Ray CPU reservation per role: four fit on a 1-CPU test cluster


@dataclass(frozen=True)
class EmbodiedSpec:
    """Everything an embodied run trains (the app builds it from its Hydra config)."""

    env: EnvWorkerConfig
    """Task, number of envs, seed, time limit, stage groups (`pipeline_stages`), pixels."""
    policy: PolicyConfig | VLAConfig | VLAPolicyConfig
    """MLP/CNN actor-critic, or a tiny OpenVLA-style VLA (needs ``env.pixels``): a bare
    `VLAConfig` gets the task's action box and instruction at launch, a `VLAPolicyConfig`
    brings its own."""
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
    """Seconds a rollout waits for one micro-batch before failing (dead or stuck peer)."""
    link_transport: Literal["p2p", "channel"] = "p2p"
    """How env and policy processes exchange micro-batches: rlinf.comm point-to-point
    messages (one per micro-batch) or named channels (two owner round trips per item)."""

    def __post_init__(self) -> None:
        if self.rollout_steps < 1:
            raise ConfigError(f"rollout_steps must be >= 1, got {self.rollout_steps}")
        if self.device not in ("cpu", "cuda"):
            raise ConfigError(f"device must be 'cpu' or 'cuda', got {self.device!r}")
        if isinstance(self.policy, VLAConfig | VLAPolicyConfig):
            vla = self.policy if isinstance(self.policy, VLAConfig) else self.policy.vla
            pixels = self.env.pixels
            if pixels is None or vla.image_shape != (3, *pixels):
                raise ConfigError(
                    f"a VLA policy sees camera frames: set env.pixels so that (3, *pixels) "
                    f"equals VLAConfig.image_shape={vla.image_shape}, got env.pixels={pixels}")
        elif not isinstance(self.policy, PolicyConfig):
            raise ConfigError(f"policy must be a PolicyConfig, VLAConfig or VLAPolicyConfig, got "
                              f"{type(self.policy).__name__}")
        if self.actor.algorithm == "grpo" and not self.reset_every_iteration:
            raise ConfigError("GRPO compares each env's first episode of a rollout: set "
                              "reset_every_iteration=True")

    @property
    def samples_per_iteration(self) -> int:
        """Env steps (training samples) per iteration."""
        return self.env.num_envs * self.rollout_steps


@dataclass(frozen=True)
class EmbodiedStepResult:
    """One iteration's outcome."""

    step: int
    """The iteration number the caller passed."""
    metrics: Mapping[str, float]
    """episode_return/episode_length/success_rate (when episodes ended), env_steps_per_s,
    loss terms, and per-component seconds."""
    seconds: float
    """Wall time of the iteration (rollout, update and weight sync)."""
    env_steps: int
    """Env steps taken."""
    spans: Sequence[Span] = ()
    """One track per worker: env_step/infer per stage group and step, train, sync."""
    onloads: int = 0
    """Onloads the device lock ran during the iteration, over every worker process (its
    context switches)."""


@dataclass(frozen=True)
class EvalResult:
    """A deterministic evaluation: each env's first episode."""

    mean_return: float
    """Mean return of the episodes."""
    success_rate: float | None
    """Fraction that succeeded (None when the task defines no success)."""
    episodes: int
    """Episodes evaluated."""
    frames: np.ndarray | None = None
    """``(T, H, W, 3)`` uint8 frames of the first env's episode when recorded."""


def _obs_bytes(spec: EmbodiedSpec) -> int:
    if isinstance(spec.policy, VLAPolicyConfig):
        return int(np.prod(spec.policy.vla.image_shape))  # uint8 frames
    if isinstance(spec.policy, VLAConfig):
        return int(np.prod(spec.policy.image_shape))
    return 4 * int(np.prod(spec.policy.obs_shape))


def embodied_workflow(spec: EmbodiedSpec) -> Workflow:
    """The macro flow as an `rlinf.sched.Workflow`: env ↔ rollout loop of `rollout_steps`
    steps over ``num_envs`` items, then the actor over every sample.

    Env and rollout each run as one process (`max_devices=1`); the actor's one process uses
    one thread per device. Placement devices are CPU slots, so every component is a ``cpu``
    resource; with ``device="cuda"`` the policy and actor processes also share the machine's
    GPU through Ray, which the profile's measured times carry.

    What the launch runs exactly, declared to the planner: the env's micro-batch is a stage
    group, so it divides ``num_envs`` (`_stages_of`); the policy serves the same stage
    groups (`same_micro_batch_as`); the actor trains once on the whole rollout.
    """
    n = spec.env.num_envs
    obs = _obs_bytes(spec)
    return Workflow(
        components=(
            Component("env", kind="env", resource="cpu", batch=n, max_devices=1,
                      micro_batch_divides=True),
            Component("rollout", kind="rollout", resource="cpu", batch=n, max_devices=1,
                      same_micro_batch_as="env"),
            Component("actor", kind="actor", resource="cpu",
                      batch=spec.samples_per_iteration, whole_batch=True),
        ),
        edges=(
            Edge("env", "rollout", bytes_per_item=2 * obs + 16),  # obs, final obs, index
            Edge("rollout", "env", bytes_per_item=16, feedback=True),
            Edge("env", "actor", bytes_per_item=obs + 32),
        ),
        global_batch=n,
        loops=(Loop(("env", "rollout"), spec.rollout_steps),),
        name=f"embodied-{spec.env.env_name}",
    )


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


def _gpus_per_role(spec: EmbodiedSpec) -> float:
    """Ray GPUs for each process that computes on CUDA: the policy's (the env process when
    inline, else the policy process) and the actor's share one GPU, so each reserves half
    of it and Ray gives both the same ``CUDA_VISIBLE_DEVICES``. Simulators stay on CPU."""
    if spec.device != "cuda":
        return 0.0
    import ray

    available = float(ray.cluster_resources().get("GPU", 0.0))
    if available < 1.0:
        raise ConfigError(f"device='cuda' but the Ray cluster has {available:g} GPUs: start "
                          "Ray on a machine with a GPU (ray.init detects it) or use "
                          "device='cpu'")
    return 0.5


def _stages_of(spec: EmbodiedSpec, plan: ExecutionPlan) -> int:
    n = spec.env.num_envs
    micro = int(plan.micro_batch.get("env", n // spec.env.pipeline_stages))
    if micro < 1 or n % micro:
        raise ConfigError(f"plan micro-batch {micro} for env must divide num_envs={n}")
    return n // micro


def _wait(futures: Sequence[GroupFuture], timeout: float) -> list[Any]:
    """Results of concurrent calls; the first failure is raised at once (its peer may be
    blocked on a channel waiting for the failed side and would only time out later)."""
    deadline = time.monotonic() + timeout
    results: list[Any] = [None] * len(futures)
    pending = set(range(len(futures)))
    while pending:
        for i in sorted(pending):
            if futures[i].done():
                results[i] = futures[i].rank_results(timeout=1.0)[0]
                pending.discard(i)
        if pending:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                futures[min(pending)].rank_results(timeout=0.0)  # raises WorkerTimeoutError
            time.sleep(min(0.002, max(remaining, 0.0)))
    return results


def _episode_metrics(episodes: Sequence[EpisodeStats]) -> dict[str, float]:
    if not episodes:
        return {"episodes": 0.0}
    out = {"episodes": float(len(episodes)),
           "episode_return": float(np.mean([e.episode_return for e in episodes])),
           "episode_length": float(np.mean([e.length for e in episodes]))}
    flags = [e.success for e in episodes if e.success is not None]
    if flags:
        out["success_rate"] = float(np.mean(flags))
    return out


@dataclass
class _Groups:
    env: WorkerGroup
    actor: WorkerGroup
    policy: WorkerGroup | None = None

    def all(self) -> list[WorkerGroup]:
        return [g for g in (self.env, self.policy, self.actor) if g is not None]


class EmbodiedFlow:
    """Env, rollout and actor workers of one run (module docstring); build with `launch`."""

    def __init__(self, spec: EmbodiedSpec, plan: ExecutionPlan, groups: _Groups, *,
                 description: EnvDescription, rollout_config: PolicyRolloutConfig |
                 VLARolloutConfig, actor_config: EmbodiedActorConfig, stages: int,
                 trace: bool, extras: dict[str, Any]) -> None:
        self.spec = spec
        self.plan = plan
        self.description = description
        self.stages = stages
        self.trace = trace
        self._groups = groups
        self._rollout_config = rollout_config
        self._actor_config = actor_config
        self._extras = extras
        self._closed = False

    # ------------------------------------------------------------------ launch
    @classmethod
    def launch(cls, spec: EmbodiedSpec, plan: ExecutionPlan, *, cluster: Cluster | None = None,
               trace: bool = False) -> EmbodiedFlow:
        """Start the workers where `plan.placement` says (Ray must be initialised)."""
        import ray

        from rlinf.sched import DeviceLockServer

        if not ray.is_initialized():
            raise ConfigError("Ray is not initialised: call ray.init(...) before "
                              "EmbodiedFlow.launch")
        placement = plan.placement
        missing = [c for c in COMPONENTS if c not in placement.components]
        if missing:
            raise ConfigError(f"plan {plan.spec!r} does not place {missing}: expected env, "
                              "rollout and actor (see embodied_workflow)")
        num_devices = cluster.num_devices if cluster is not None else placement.num_devices
        for name in ("env", "rollout"):
            if len(placement.devices_of(name)) != 1 or placement.procs_per_device(name) != 1:
                raise ConfigError(f"{name} runs as one process on one device; plan "
                                  f"{plan.spec!r} gives it {placement.devices_of(name)}")
        stages = _stages_of(spec, plan)
        env_config = replace(spec.env, pipeline_stages=stages)
        inline = bool(set(placement.devices_of("env")) & set(placement.devices_of("rollout")))
        gpus = _gpus_per_role(spec)
        token = new_token()
        lock = DeviceLockServer(token=token, num_devices=num_devices,
                                device_memory=cluster.device_memory() if cluster else None)
        host, port = lock.address
        run = uuid.uuid4().hex[:8]
        common: dict[str, Any] = {
            "env_vars": {"RLINF_COMM_TOKEN": token.hex()}, "num_cpus_per_rank": _CPU_PER_RANK,
            "device_lock_address": f"{host}:{port}", "device_lock_token": token,
            "log_level": "WARNING"}
        role_opts = {"trace": trace, "num_threads": spec.torch_threads}
        launched: list[WorkerGroup] = []
        try:
            probe = EnvWorker(WorkerContext(role="probe", rank=0, world_size=1),
                              config=replace(env_config, num_envs=1, pipeline_stages=1,
                                             same_start_group_size=1))
            try:
                description = describe_env(probe)
            finally:
                probe.shutdown()
            rollout_config, actor_config = _policy_configs(spec, description)
            link = RoleLink(f"embodied-{run}-obs", f"embodied-{run}-actions",
                            store=f"embodied-{run}-store", timeout=spec.link_timeout,
                            transport=spec.link_transport)
            # The groups start concurrently: each launch waits seconds for its processes.
            jobs: dict[str, tuple[type[RoleBase], dict[str, Any]]] = {
                "env": (EnvRole, {"placement": placement.components["env"], "init_kwargs": {
                    "config": env_config, **role_opts,
                    **({"policy": rollout_config} if inline else {"link": link})},
                    "num_gpus_per_rank": gpus if inline else 0.0}),
                # One process spanning the actor's devices (one torch thread per device).
                "actor": (ActorRole, {"role": "actor", "num_ranks": 1, "init_kwargs": {
                    "config": actor_config, **role_opts,
                    "devices": placement.devices_of("actor")}, "num_gpus_per_rank": gpus}),
            }
            if not inline:
                jobs["rollout"] = (PolicyRole, {
                    "placement": placement.components["rollout"],
                    "init_kwargs": {"config": rollout_config, "link": link, **role_opts},
                    "num_gpus_per_rank": gpus})
            with ThreadPoolExecutor(max_workers=len(jobs)) as pool:
                futures = {name: pool.submit(WorkerGroup.launch, cls_, **options, **common)
                           for name, (cls_, options) in jobs.items()}
                started: dict[str, WorkerGroup] = {}
                errors: list[BaseException] = []
                for name, future in futures.items():
                    try:
                        started[name] = future.result()
                        launched.append(started[name])
                    except BaseException as exc:
                        errors.append(exc)
            if errors:
                raise errors[0]
            env_group, actor_group = started["env"], started["actor"]
            policy_group = started.get("rollout")
            if policy_group is not None:
                _wait([env_group.call_async("open_link"),
                       policy_group.call_async("open_link")], spec.link_timeout)
            # Trajectories env -> actor and weights actor -> policy go over channels owned
            # by their consumer: the driver passes control only.
            channels = {
                "trajectory": FlowChannel("env", "actor", f"embodied-{run}/env->actor",
                                          link.store, consumer_ranks=1),
                "weights": FlowChannel("actor", "rollout", f"embodied-{run}/actor->rollout",
                                       link.store, consumer_ranks=1)}
            _wait([actor_group.call_async("create_trajectory_channel", channels["trajectory"]),
                   (policy_group or env_group).call_async("create_weights_channel",
                                                          channels["weights"])],
                  spec.link_timeout)
        except BaseException:
            for group in launched:
                group.kill()
            lock.close()
            raise
        groups = _Groups(env=env_group, actor=actor_group, policy=policy_group)
        flow = cls(spec, plan, groups, description=description, rollout_config=rollout_config,
                   actor_config=actor_config, stages=stages, trace=trace,
                   extras={"lock": lock, "store": link.store, **channels})
        flow._sync_weights()
        _log.info("embodied_flow_launched", plan=plan.spec, mode=plan.mode.value,
                  stages=stages, inline=inline)
        return flow

    @property
    def inline(self) -> bool:
        """Whether env and policy share one process (collocated placement)."""
        return self._groups.policy is None

    # ------------------------------------------------------------------ iteration
    def _rollout_target(self) -> WorkerGroup:
        return self._groups.env if self._groups.policy is None else self._groups.policy

    def _sync_weights(self, *, pushed: bool = False) -> float:
        """Load the actor's weights into the rollout policy through the weights channel
        (`pushed`: the actor put them already, at the end of its training step)."""
        started = time.perf_counter()
        if not pushed:
            self._groups.actor.call("push_weights", self._extras["weights"])
        self._rollout_target().call("pull_weights", self._extras["weights"])
        return time.perf_counter() - started

    def _iteration(self, step: int) -> tuple[RolloutReport, list[Span], TrainReport]:
        """Rollout and training of iteration `step`, started together: the env role puts
        its trajectory into the actor's channel, the actor (waiting without its devices)
        trains on it and puts the new weights into the policy's channel."""
        steps = self.spec.rollout_steps
        timeout = self.spec.link_timeout * (steps + 2)
        trajectory = self._extras["trajectory"]
        futures = [
            self._groups.env.call_async("rollout", num_steps=steps, step=step,
                                        trajectory_channel=trajectory),
            self._groups.actor.call_async("train_step", step, trajectory_channel=trajectory,
                                          weights_channel=self._extras["weights"])]
        if self._groups.policy is not None:
            futures.append(self._groups.policy.call_async("serve", num_steps=steps,
                                                          num_stages=self.stages))
        report, trained, *served = _wait(futures, timeout)
        return report, [span for spans in served for span in spans], trained

    def step(self, step: int) -> EmbodiedStepResult:
        """One iteration: rollout → actor training → weight sync; trajectories and weights
        travel over channels between the roles (`_iteration`)."""
        self._check_open()
        started, wall_start = time.perf_counter(), time.time()
        if self.spec.reset_every_iteration:
            self._groups.env.call("reset", seed=self._reset_seed(step))
        report, policy_spans, trained = self._iteration(step)
        rollout_s, train_s = report.seconds, trained.seconds
        sync_start = time.time()
        sync_s = self._sync_weights(pushed=True)
        seconds = time.perf_counter() - started
        metrics: dict[str, float] = {
            **_episode_metrics(report.episodes), **trained.stats,
            "env_steps_per_s": report.env_steps / seconds,
            "rollout_steps_per_s": report.env_steps / rollout_s,
            "rollout_seconds": rollout_s, "train_seconds": train_s, "sync_seconds": sync_s,
            "env_step_seconds": report.step_seconds, "env_wait_seconds": report.wait_seconds,
            "iteration_seconds": seconds,
        }
        spans: list[Span] = [*report.spans, *policy_spans, *trained.spans]
        if self.trace:
            spans.append(Span("driver/0", "sync", sync_start, sync_start + sync_s))
        return EmbodiedStepResult(step=step, metrics=metrics, seconds=seconds,
                                  env_steps=report.env_steps, spans=tuple(spans),
                                  onloads=self.onloads(since=wall_start))

    def onloads(self, *, since: float) -> int:
        """Onloads the device lock ran in every worker process since Unix time `since`."""
        return count_onloads(self._groups.all(), since=since, timeout=self.spec.link_timeout)

    def _reset_seed(self, step: int) -> int:
        return self.spec.env.seed + (step + 1) * self.spec.env.num_envs

    def get_weights(self) -> dict[str, torch.Tensor]:
        """The actor's current parameters (CPU copies)."""
        self._check_open()
        return weights_from_wire(self._groups.actor.call("get_weights")[0])

    # ------------------------------------------------------------------ evaluation
    def evaluate(self, *, num_episodes: int, seed: int, record_video: bool = False,
                 max_steps: int = 1000) -> EvalResult:
        """Mean return of each of `num_episodes` fresh envs' first episode, acting with the
        current weights deterministically (in the driver process); `record_video` keeps the
        frames of env 0's episode."""
        self._check_open()
        if num_episodes < 1:
            raise ConfigError(f"num_episodes must be >= 1, got {num_episodes}")
        context = WorkerContext(role="eval", rank=0, world_size=1)
        policy_config = replace(self._rollout_config, deterministic=True, seed=seed,
                                num_threads=None)
        policy = build_rollout_policy(context, policy_config)
        policy.set_weights(self.get_weights())
        worker = EnvWorker(context, config=replace(
            self.spec.env, num_envs=num_episodes, seed=seed, pipeline_stages=num_episodes,
            same_start_group_size=1))
        try:
            return _evaluate(worker, policy, max_steps=max_steps, record_video=record_video)
        finally:
            worker.shutdown()

    # ------------------------------------------------------------------ checkpoints
    def save(self, directory: Path) -> None:
        """Write actor, rollout policy and (unless reset_every_iteration) simulator state."""
        self._check_open()
        directory = Path(directory)
        directory.mkdir(parents=True, exist_ok=True)
        torch.save(self._groups.actor.call("state")[0], directory / "actor.pt")
        policy = (self._groups.policy.call("state")[0] if self._groups.policy is not None
                  else self._groups.env.call("policy_state")[0])
        torch.save(policy, directory / "policy.pt")
        env_state = (None if self.spec.reset_every_iteration
                     else self._groups.env.call("state")[0]["env"])
        torch.save({"format": _FORMAT, "env": env_state, "stages": self.stages,
                    "inline": self.inline}, directory / "env.pt")

    def load(self, directory: Path) -> None:
        """Restore what `save` wrote (same spec; any placement with the same stage groups)."""
        self._check_open()
        directory = Path(directory)
        try:
            meta = torch.load(directory / "env.pt", weights_only=False)
            actor = torch.load(directory / "actor.pt", weights_only=False)
            policy_state = torch.load(directory / "policy.pt", weights_only=False)
        except FileNotFoundError as exc:
            raise ConfigError(f"{directory} is not an embodied flow checkpoint (missing "
                              f"{Path(exc.filename or '').name}): pass a directory written by "
                              "EmbodiedFlow.save") from exc
        if meta.get("format") != _FORMAT:
            raise ConfigError(f"{directory} holds format {meta.get('format')!r}, expected "
                              f"{_FORMAT!r}")
        if meta["stages"] != self.stages:
            raise ConfigError(f"the checkpoint ran {meta['stages']} stage groups, this flow "
                              f"{self.stages}: sampling differs by grouping; use the same plan "
                              "micro-batch")
        env_state = meta["env"]
        if env_state is None and not self.spec.reset_every_iteration:
            raise ConfigError(f"{directory} has no env state (saved with "
                              "reset_every_iteration=True) but this spec continues episodes")
        self._groups.actor.call("load_state", actor)
        if self._groups.policy is None:
            self._groups.env.call("load_state", {"env": env_state, "policy": policy_state})
        else:
            self._groups.env.call("load_state", {"env": env_state, "policy": None})
            self._groups.policy.call("load_state", policy_state)
        self._sync_weights()

    # ------------------------------------------------------------------ profiling
    def measure(self, *, batch_sizes: Sequence[int], repeats: int = 5) -> Profile:
        """Per-component profile for `auto`: env steps of stage groups of each size, policy
        inference of micro-batches of each size, actor updates of ``size × rollout_steps``
        samples on 1 and 2 threads; on fresh copies, so training state is untouched."""
        self._check_open()
        profile = measure_components(
            env=replace(self.spec.env, pipeline_stages=1), rollout=self._rollout_config,
            actor=self._actor_config, rollout_steps=self.spec.rollout_steps,
            batch_sizes=batch_sizes, repeats=repeats)
        extra = list(self._measure_iteration_overhead(repeats))
        if self._groups.policy is None:
            return Profile((*profile.measurements, *extra), profile.switches, profile.metadata)
        # The link between the env and policy processes: round trips of messages of each
        # size, measured between the real processes (`planning.link_cluster` fits them to
        # the cluster's latency per message and bandwidth for the simulator).
        count = 10 * repeats
        links = extra
        for size in sorted(set(batch_sizes)):
            rtt, _ = _wait([self._groups.env.call_async("ping", count=count, batch_size=size),
                            self._groups.policy.call_async("echo", count=count)],
                           self.spec.link_timeout)
            links.append(Measurement("link", size, 1, float(rtt), 0, memory_source="none",
                                     timestamp=time.time()))
        return Profile((*profile.measurements, *links), profile.switches, profile.metadata)

    def _measure_iteration_overhead(self, repeats: int) -> tuple[Measurement, Measurement]:
        """What every iteration pays besides the dataflow the simulator models, measured on
        this flow: ``weight_sync`` (actor → policy over the weights channel, unchanged
        weights) and ``control`` (the driver's round trips to every role: the iteration's
        calls, the device-lock count, and a reset where the spec resets each iteration)."""
        syncs = [self._sync_weights() for _ in range(max(repeats, 1))]
        trips = []
        for _ in range(max(repeats, 1)):
            started = time.perf_counter()
            _wait([g.call_async("worker_info") for g in self._groups.all()],
                  self.spec.link_timeout)
            trips.append(time.perf_counter() - started)
        round_trips = 2 + int(self.spec.reset_every_iteration)
        now = time.time()
        return (Measurement("weight_sync", 1, 1, float(np.median(syncs)), 0,
                            memory_source="none", timestamp=now),
                Measurement("control", 1, 1, round_trips * float(np.median(trips)), 0,
                            memory_source="none", timestamp=now))

    # ------------------------------------------------------------------ teardown
    def _check_open(self) -> None:
        if self._closed:
            raise ConfigError("this EmbodiedFlow was closed; launch a new one")

    def close(self) -> None:
        """Stop every worker (dead ones included) and the device lock; idempotent."""
        if self._closed:
            return
        self._closed = True
        import ray

        for group in self._groups.all():
            try:
                group.shutdown(timeout=10.0)
            except WorkersError:
                group.kill()
        self._extras["lock"].close()
        with contextlib.suppress(ValueError):  # no store when there was no link
            ray.kill(ray.get_actor(self._extras["store"]))

    def __enter__(self) -> EmbodiedFlow:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _policy_configs(spec: EmbodiedSpec, desc: EnvDescription
                    ) -> tuple[PolicyRolloutConfig | VLARolloutConfig, EmbodiedActorConfig]:
    if isinstance(spec.policy, VLAConfig | VLAPolicyConfig):
        network = spec.policy if isinstance(spec.policy, VLAConfig) else spec.policy.vla
        if desc.discrete_actions is not None or len(desc.action_low) != network.action_dim:
            raise ConfigError(f"VLAConfig.action_dim={network.action_dim} but "
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


def _evaluate(worker: EnvWorker, policy: Any, *, max_steps: int,
              record_video: bool) -> EvalResult:
    env = worker.env
    groups = worker.groups  # one env per group: env 0 renders alone
    obs = np.asarray(env.reset(seed=worker.config.seed)[0])
    env.pop_finished_episodes()
    count = env.num_envs
    first: dict[int, EpisodeStats] = {}
    frames: list[np.ndarray] = []
    index = np.arange(count)
    no_final = np.zeros(count, dtype=bool)
    for _ in range(max_steps):
        if record_video and 0 not in first:
            frames.append(groups[0].render()[0])
        reply = policy.infer(Batch({"obs": obs, "final_obs": np.zeros_like(obs),
                                    "final_mask": no_final, "env_index": index}))
        result = env.step(_clip(env.single_action_space, reply))
        obs = np.asarray(result.obs)
        for episode in env.pop_finished_episodes():
            first.setdefault(episode.env_index, episode)
        if len(first) == count:
            break
    if len(first) < count:
        raise ConfigError(f"{count - len(first)} of {count} evaluation episodes did not end "
                          f"within {max_steps} steps: raise max_steps or set a time limit")
    episodes = [first[i] for i in range(count)]
    flags = [e.success for e in episodes if e.success is not None]
    return EvalResult(
        mean_return=float(np.mean([e.episode_return for e in episodes])),
        success_rate=float(np.mean(flags)) if flags else None, episodes=count,
        frames=np.stack(frames) if frames else None)


def _clip(space: Any, reply: Batch) -> np.ndarray:
    import gymnasium as gym

    action = np.asarray(reply.tensors["action"])
    if isinstance(space, gym.spaces.Box):  # the Gaussian is unbounded; the simulator is not
        return np.clip(action, space.low, space.high)
    return action
