"""`EnvRole`: the simulators as a flow component; observations out, actions in.

Its entry `rollout` runs one iteration's loop of ``ctx.loop_steps`` steps. With the policy
in another process (hybrid, disaggregated placements) it exchanges stage-group
micro-batches with that `PolicyRole` over the loop's two edges, pipelined: while the policy
computes the actions of group g+1, this process steps group g. Where the plan co-places the
policy (`ComponentSpec.inline_with`), the runtime constructs this role with ``policy=``:
env and policy take turns in this one process, every observation batch answered at once
(no transport at all). Either way the trajectory then goes to the trainer over its channel;
the driver sees statistics only.

Placed on several devices, the env component runs one rank per device, each simulating an
equal contiguous share of the run's envs (`EnvWorkerConfig.shard`: the same seeds and
sampling streams as one worker would use), with its inline policy or its paired policy
rank (`FlowChannel.peers`: a policy rank batches the env ranks it serves); the trainer
joins their trajectories.
"""

from __future__ import annotations

import threading
import time
from collections import deque
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import gymnasium as gym
import numpy as np

from rlinf.comm import Batch
from rlinf.envs.embodied import EpisodeStats
from rlinf.workers.embodied.roles.policy_role import (
    PING,
    RolloutPolicy,
    build_rollout_policy,
    env_scope,
)
from rlinf.workers.embodied.roles.weights import PolicyTarget
from rlinf.workers.embodied.rollout import PolicyRolloutConfig
from rlinf.workers.embodied.vla_policy import VLARolloutConfig
from rlinf.workers.env.config import EnvWorkerConfig
from rlinf.workers.env.link import ActionSource, LinkTimeoutError, ObsSink, ScopedLink
from rlinf.workers.env.trajectory import Trajectory
from rlinf.workers.env.worker import EnvRollout, EnvWorker
from rlinf.workers.errors import ConfigError
from rlinf.workers.flow import FlowChannel, StepContext, WeightReceiver
from rlinf.workers.flow.channels import rank_key
from rlinf.workers.runtime.context import WorkerContext
from rlinf.workers.telemetry import Span, TraceRecorder
from rlinf.workers.weight_sync import WeightTarget

__all__ = ["EnvDescription", "EnvRole", "RolloutReport", "describe_env", "episode_means",
           "pool_rollout_metrics", "rollout_metrics"]


@dataclass(frozen=True)
class RolloutReport:
    """What one in-process rollout (`EnvRole.collect`) produced."""

    trajectory: Trajectory
    """Every env's steps (stage groups joined, env order)."""
    episodes: tuple[EpisodeStats, ...]
    """Episodes that ended during the rollout."""
    env_steps: int
    """Env steps taken."""
    seconds: float
    """Wall time of the rollout."""
    step_seconds: float
    """Time inside the simulators' `step`."""
    wait_seconds: float
    """Time waiting for actions."""
    spans: tuple[Span, ...]
    """``env_step`` and ``infer`` spans per stage group and step."""


@dataclass(frozen=True)
class EnvDescription:
    """Spaces and instruction of an env role's task (to shape policies)."""

    obs_shape: tuple[int, ...]
    """Shape of one observation."""
    obs_dtype: str
    """Numpy dtype name of observations."""
    action_shape: tuple[int, ...]
    """Shape of one action (() for discrete)."""
    discrete_actions: int | None
    """Number of actions of a discrete space, else None."""
    action_low: tuple[float, ...]
    """Lower bounds of a box action space (empty for discrete)."""
    action_high: tuple[float, ...]
    """Upper bounds of a box action space (empty for discrete)."""
    instruction: str
    """Language instruction of the task."""


def describe_env(worker: EnvWorker) -> EnvDescription:
    """Spaces and instruction of an env worker's task."""
    obs_space, action_space = worker.observation_space, worker.action_space
    low: tuple[float, ...] = ()
    high: tuple[float, ...] = ()
    if isinstance(action_space, gym.spaces.Box):
        low = tuple(float(x) for x in np.ravel(action_space.low))
        high = tuple(float(x) for x in np.ravel(action_space.high))
    return EnvDescription(
        obs_shape=tuple(obs_space.shape or ()),
        obs_dtype=str(np.dtype(obs_space.dtype)) if obs_space.dtype is not None else "",
        action_shape=tuple(action_space.shape or ()),
        discrete_actions=(int(action_space.n) if isinstance(action_space, gym.spaces.Discrete)
                          else None),
        action_low=low, action_high=high, instruction=worker.instruction,
    )


def rollout_metrics(result: EnvRollout) -> dict[str, float]:
    """A rollout's statistics as the flat sums an entry returns (the caller pools means):
    episodes and their return, length and success sums, env steps and times."""
    episodes = result.episodes
    flags = [e.success for e in episodes if e.success is not None]
    return {"episodes": float(len(episodes)),
            "return_sum": float(sum(e.episode_return for e in episodes)),
            "length_sum": float(sum(e.length for e in episodes)),
            "success_sum": float(sum(bool(f) for f in flags)), "success_count": float(len(flags)),
            "env_steps": float(result.env_steps), "rollout_seconds": float(result.seconds),
            "step_seconds": float(result.step_seconds), "wait_seconds": float(result.wait_seconds)}


def pool_rollout_metrics(ranks: Sequence[Mapping[str, float]]) -> dict[str, float]:
    """The `rollout_metrics` of several env ranks as one: counts and sums added, the
    rollout's wall time the slowest rank's, simulator and wait times the mean rank's."""
    if not ranks:
        raise ConfigError("no env rank reported rollout metrics")
    pooled = {name: float(sum(rank[name] for rank in ranks)) for name in ranks[0]}
    pooled["rollout_seconds"] = max(float(rank["rollout_seconds"]) for rank in ranks)
    for name in ("step_seconds", "wait_seconds"):
        pooled[name] /= len(ranks)
    return pooled


def episode_means(sums: Mapping[str, float]) -> dict[str, float]:
    """The episode count and mean return, length and (where the task reports it) success
    rate of `rollout_metrics` sums (pooled over ranks or not)."""
    episodes = sums["episodes"]
    if not episodes:
        return {"episodes": 0.0}
    out = {"episodes": episodes, "episode_return": sums["return_sum"] / episodes,
           "episode_length": sums["length_sum"] / episodes}
    if sums["success_count"]:
        out["success_rate"] = sums["success_sum"] / sums["success_count"]
    return out


class _InlineLink:
    """Sink and source in one: `put` runs the policy at once, `get` pops its answer. Stage
    groups stepped concurrently (`EnvWorker.concurrent_groups`) infer one at a time."""

    def __init__(self, policy: RolloutPolicy, trace: TraceRecorder) -> None:
        self._policy = policy
        self._trace = trace
        self._replies: dict[str | None, deque[Batch]] = {}
        self._lock = threading.Lock()
        self.seconds = 0.0
        """Time spent in the policy (the inlined component's busy time)."""

    def put(self, item: Batch, *, key: str | None = None) -> None:
        with self._lock:
            start, t0 = time.time(), time.perf_counter()
            reply = self._policy.infer(item)
            self.seconds += time.perf_counter() - t0
            self._replies.setdefault(key, deque()).append(reply)
        self._trace.add("infer", start, time.time(), stage=item.meta.get("stage"),
                        step=item.meta.get("step"))

    def get(self, *, key: str | None = None, timeout: float | None = None) -> Batch:
        pending = self._replies.get(key)
        if not pending:
            raise LinkTimeoutError(f"no reply pending under key {key!r}; a get without a put")
        return pending.popleft()


class EnvRole(WeightReceiver):
    """Simulators of one rank (module docstring); ``policy=`` serves the policy inline."""

    def __init__(self, context: WorkerContext, *, config: EnvWorkerConfig,
                 policy: PolicyRolloutConfig | VLARolloutConfig | None = None,
                 reset_every_iteration: bool = False, trace: bool = False,
                 num_threads: int | None = None, io_timeout: float = 600.0) -> None:
        super().__init__(context, trace=trace, io_timeout=io_timeout,
                         num_threads=num_threads or max(1, len(context.devices)))
        self.run_envs = config
        """Every env of the run (this rank simulates its share, ``self.env.config``)."""
        self.env = EnvWorker(context, config=config.shard(context.rank, context.world_size))
        self.reset_every_iteration = reset_every_iteration
        self.policy: RolloutPolicy | None = (
            build_rollout_policy(context, policy) if policy is not None else None)

    def resident_memory_bytes(self) -> int | None:
        """0: its onload/offload move nothing (simulators, and an inline policy, stay where
        they are), so the device lock never evicts a co-placed actor for it — as the
        simulator prices it (an unknown size would evict the actor every turn)."""
        return 0

    def onload(self) -> None:
        """Nothing to move (simulators and an inline policy stay in host memory); having
        the hooks, the env takes part in its devices' switches as the simulator prices it."""

    def offload(self) -> None:
        """Nothing to free (see `onload`)."""

    def describe(self) -> EnvDescription:
        """Spaces and instruction of the task."""
        return describe_env(self.env)

    def reset_seed(self, step: int) -> int:
        """The seed iteration `step` resets this rank's env 0 from (with
        ``reset_every_iteration``): env j of the run gets ``seed + (step + 1) * num_envs + j``
        whichever rank simulates it."""
        run = self.run_envs
        return (run.seed + (step + 1) * run.num_envs
                + self.env.config.first_env - run.first_env)

    def rollout(self, ctx: StepContext, *, inputs: Mapping[str, FlowChannel],
                outputs: Mapping[str, FlowChannel]) -> dict[str, float]:
        """Iteration ``ctx.step``: ``ctx.loop_steps`` steps of every env (continuing open
        episodes, or from resets seeded by the step), the trajectory put into the trainer's
        channel (the output outside the loop); returns `rollout_metrics`."""
        partners = set(inputs) & set(outputs)
        trainers = [name for name in outputs if name not in partners]
        if len(trainers) != 1 or len(partners) > 1 or (self.policy is None) == (not partners):
            raise ConfigError(f"EnvRole expects one trainer output and either a policy peer "
                              f"or an inline policy; got inputs {sorted(inputs)}, outputs "
                              f"{sorted(outputs)}, inline policy {self.policy is not None}")
        if self.reset_every_iteration:
            self.env.reset(seed=self.reset_seed(ctx.step))
        num_steps = ctx.loop_steps[self.role]
        inline = _InlineLink(self.policy, self.trace) if self.policy is not None else None
        with self.turn("rollout", step=ctx.step):
            if inline is not None:
                result = self.env.rollout(num_steps=num_steps, sink=inline, source=inline,
                                          trace=self.trace)
            else:
                peer = next(iter(partners))
                out_link, in_link = self.link(outputs[peer]), self.link(inputs[peer])
                sink: ObsSink = out_link
                source: ActionSource = in_link
                if self.context.world_size > 1:  # the policy tells env ranks apart by key
                    scope = env_scope(self.rank)
                    sink, source = ScopedLink(out_link, scope), ScopedLink(in_link, scope)
                result = self.env.rollout(num_steps=num_steps, sink=sink, source=source,
                                          timeout=self.io_timeout, trace=self.trace)
        if inline is not None:  # the inlined policy's own busy time, for its profile
            guest = next(n for n, host in ctx.inlined.items() if host == self.role)
            self.charge(guest, inline.seconds)
        trajectory = Trajectory.concat(result.trajectories)
        self.channel(outputs[trainers[0]]).put(trajectory.to_batch(step=ctx.step),
                                              key=rank_key(0))
        return rollout_metrics(result)

    def collect(self, *, num_steps: int, step: int = 0) -> RolloutReport:
        """A rollout with the inline policy, in this process, returning the trajectory (use
        without a flow: tests, single-process drivers)."""
        inline = _InlineLink(self._inline(), self.trace)
        with self.turn("rollout", step=step):
            result = self.env.rollout(num_steps=num_steps, sink=inline, source=inline,
                                      trace=self.trace)
        return RolloutReport(
            trajectory=Trajectory.concat(result.trajectories), episodes=result.episodes,
            env_steps=result.env_steps, seconds=result.seconds, step_seconds=result.step_seconds,
            wait_seconds=result.wait_seconds, spans=tuple(self.drain_spans()))

    def ping(self, *, count: int, batch_size: int, output_channel: FlowChannel,
             input_channel: FlowChannel) -> float:
        """Median round trip (seconds) of an observation-sized micro-batch of `batch_size`
        envs to the policy role and back over the loop's edges (it runs `echo`): the link's
        cost per message pair, for the planner's model of pipelined placements."""
        obs = np.zeros((batch_size, *(self.env.observation_space.shape or ())),
                       dtype=self.env.observation_space.dtype)
        message = Batch({"obs": obs, "final_obs": obs, "final_mask": np.zeros(batch_size, bool),
                         "env_index": np.arange(batch_size)})
        sink, source = self.link(output_channel), self.link(input_channel)
        times = []
        for _ in range(count):
            started = time.perf_counter()
            sink.put(message, key=PING)
            source.get(key=PING, timeout=self.io_timeout)
            times.append(time.perf_counter() - started)
        return float(np.median(times))

    def reset(self, *, seed: int | None = None) -> None:
        """Start new episodes in every env (env i seeded with seed + i when given)."""
        self.env.reset(seed=seed)

    def weight_target(self) -> WeightTarget:
        """The inline policy: the trainer's weights load into it."""
        return PolicyTarget(self._inline())

    def _inline(self) -> RolloutPolicy:
        if self.policy is None:
            raise ConfigError("this EnvRole has no inline policy (its policy is a PolicyRole)")
        return self.policy

    def state(self) -> dict[str, Any]:
        """Simulator state, current observations and (inline) the policy's sampling state."""
        return {"env": self.env.state(), "policy": self.policy_state()}

    def load_state(self, state: Mapping[str, Any]) -> None:
        """Inverse of `state`; a None part is left as it is."""
        if state.get("env") is not None:
            self.env.load_state(state["env"])
        if state.get("policy") is not None:
            self._inline().load_state(state["policy"])

    def policy_state(self) -> dict[str, Any] | None:
        """The inline policy's weights and sampling streams (None without one)."""
        return None if self.policy is None else self.policy.state()

    def render(self) -> np.ndarray:
        """Frames of every env, ``uint8 (N, H, W, 3)``."""
        return self.env.env.render()

    def shutdown(self) -> None:
        """Close the simulators, then the base worker's resources (channels, buffers)."""
        self.env.shutdown()
        super().shutdown()
