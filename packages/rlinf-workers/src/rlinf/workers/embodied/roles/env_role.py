"""`EnvRole`: the simulators as a Ray worker; observations out, actions in.

With a `RoleLink` the env role talks to a `PolicyRole` in another process through two
rlinf.comm channels, stage groups pipelined: while the policy computes the actions of group
g+1, this process steps group g. With an inline policy instead (the collocated placement),
env and policy take turns in this one process, every observation batch answered at once
(no transport at all).
"""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import gymnasium as gym
import numpy as np

from rlinf.comm import Batch
from rlinf.envs.embodied import EpisodeStats
from rlinf.workers.embodied.roles.base import RoleBase, Weights, weights_from_wire
from rlinf.workers.embodied.roles.link import LinkEnds, RoleLink, open_link
from rlinf.workers.embodied.roles.policy_role import PING, RolloutPolicy, build_rollout_policy
from rlinf.workers.embodied.rollout import PolicyRolloutConfig
from rlinf.workers.embodied.vla_policy import VLARolloutConfig
from rlinf.workers.env.config import EnvWorkerConfig
from rlinf.workers.env.link import LinkTimeoutError
from rlinf.workers.env.trajectory import Trajectory
from rlinf.workers.env.worker import EnvWorker
from rlinf.workers.errors import ConfigError
from rlinf.workers.flow import FlowChannel, rank_key
from rlinf.workers.runtime.context import WorkerContext
from rlinf.workers.telemetry import Span, TraceRecorder

__all__ = ["EnvDescription", "EnvRole", "RolloutReport", "describe_env"]


@dataclass(frozen=True)
class RolloutReport:
    """What one rollout of an env role produced."""

    trajectory: Trajectory | None
    """Every env's steps (stage groups joined, env order); None when they went to the
    trainer through a channel (`EnvRole.rollout`'s `trajectory_channel`)."""
    episodes: tuple[EpisodeStats, ...]
    """Episodes that ended during the rollout."""
    env_steps: int
    """Env steps taken."""
    seconds: float
    """Wall time of the rollout inside the env role."""
    step_seconds: float
    """Time inside the simulators' `step`."""
    wait_seconds: float
    """Time waiting for actions (inference not hidden behind simulation)."""
    spans: tuple[Span, ...]
    """``env_step`` (and, inline, ``infer``) spans per stage group and step."""


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


class _InlineLink:
    """Sink and source in one: `put` runs the policy at once, `get` pops its answer."""

    def __init__(self, policy: RolloutPolicy, trace: TraceRecorder) -> None:
        self._policy = policy
        self._trace = trace
        self._replies: dict[str | None, deque[Batch]] = {}

    def put(self, item: Batch, *, key: str | None = None) -> None:
        start = time.time()
        self._replies.setdefault(key, deque()).append(self._policy.infer(item))
        self._trace.add("infer", start, time.time(), stage=item.meta.get("stage"),
                        step=item.meta.get("step"))

    def get(self, *, key: str | None = None, timeout: float | None = None) -> Batch:
        pending = self._replies.get(key)
        if not pending:
            raise LinkTimeoutError(f"no reply pending under key {key!r}; a get without a put")
        return pending.popleft()


class EnvRole(RoleBase):
    """Simulators of one rank (module docstring); give exactly one of `link` and `policy`."""

    def __init__(self, context: WorkerContext, *, config: EnvWorkerConfig,
                 link: RoleLink | None = None,
                 policy: PolicyRolloutConfig | VLARolloutConfig | None = None,
                 trace: bool = False, num_threads: int | None = None) -> None:
        super().__init__(context, trace=trace, num_threads=num_threads)
        if (link is None) == (policy is None):
            raise ConfigError("an EnvRole needs exactly one of link= (a PolicyRole elsewhere) "
                              "and policy= (inference inline, collocated)")
        self.env = EnvWorker(context, config=config)
        self.link = link
        self.policy: RolloutPolicy | None = (
            build_rollout_policy(context, policy) if policy is not None else None)
        self._ends: LinkEnds | None = None

    def resident_memory_bytes(self) -> int | None:
        """0: its onload/offload move nothing (simulators, and an inline policy, stay where
        they are), so the device lock never evicts a co-placed actor for it — as the
        simulator prices it (an unknown size would evict the actor every turn)."""
        return 0

    def describe(self) -> EnvDescription:
        """Spaces and instruction of the task."""
        return describe_env(self.env)

    def open_link(self) -> None:
        """Open this side of the link (actions in, observations out)."""
        if self.link is None:
            raise ConfigError("this EnvRole runs its policy inline; it has no link to open")
        if self._ends is None:
            self._ends = open_link(self.link, inbound=self.link.actions,
                                   outbound=self.link.observations)

    def rollout(self, *, num_steps: int, step: int = 0,
                trajectory_channel: FlowChannel | None = None) -> RolloutReport:
        """Iteration `step`'s rollout of `num_steps` steps of every env (continuing open
        episodes). With `trajectory_channel` (a flow) the trajectory goes straight to the
        trainer through it and the report carries only statistics; without, the report
        carries it (in-process use)."""
        with self.turn("rollout", step=step):
            if self.policy is not None:
                link = _InlineLink(self.policy, self.trace)
                result = self.env.rollout(num_steps=num_steps, sink=link, source=link,
                                          trace=self.trace)
            else:
                if self._ends is None or self.link is None:
                    raise ConfigError("EnvRole.rollout before open_link(): connect the roles")
                result = self.env.rollout(num_steps=num_steps, sink=self._ends.outbound,
                                          source=self._ends.inbound, timeout=self.link.timeout,
                                          trace=self.trace)
        trajectory = Trajectory.concat(result.trajectories)
        if trajectory_channel is not None:
            self.channel(trajectory_channel).put(trajectory.to_batch(step=step),
                                                 key=rank_key(0))
        return RolloutReport(
            trajectory=trajectory if trajectory_channel is None else None,
            episodes=result.episodes,
            env_steps=result.env_steps, seconds=result.seconds, step_seconds=result.step_seconds,
            wait_seconds=result.wait_seconds, spans=tuple(self.drain_spans()))

    def ping(self, *, count: int, batch_size: int) -> float:
        """Median round trip (seconds) of an observation-sized micro-batch of `batch_size`
        envs to the policy role and back (it runs `echo(count=count)`): the link's cost per
        message pair, for the planner's model of pipelined placements."""
        if self._ends is None or self.link is None:
            raise ConfigError("EnvRole.ping needs an open link (not an inline policy)")
        obs = np.zeros((batch_size, *(self.env.observation_space.shape or ())),
                       dtype=self.env.observation_space.dtype)
        message = Batch({"obs": obs, "final_obs": obs, "final_mask": np.zeros(batch_size, bool),
                         "env_index": np.arange(batch_size)})
        times = []
        for _ in range(count):
            started = time.perf_counter()
            self._ends.outbound.put(message, key=PING)
            self._ends.inbound.get(key=PING, timeout=self.link.timeout)
            times.append(time.perf_counter() - started)
        return float(np.median(times))

    def reset(self, *, seed: int | None = None) -> None:
        """Start new episodes in every env (env i seeded with seed + i when given)."""
        self.env.reset(seed=seed)

    def set_weights(self, weights: Weights) -> None:
        """Load the actor's parameters into the inline policy."""
        self._inline().set_weights(weights_from_wire(weights))

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
        """Disconnect the channels, close the simulators, then the base worker's resources."""
        if self._ends is not None:
            self._ends.close()
            self._ends = None
        self.env.shutdown()

        super().shutdown()
