"""`PolicyRole`: policy inference as its own Ray worker, serving an env role over channels."""

from __future__ import annotations

import time
from collections.abc import Mapping
from typing import Any

import torch

from rlinf.workers.embodied.roles.base import RoleBase, Weights, weights_from_wire
from rlinf.workers.embodied.roles.link import LinkEnds, RoleLink, open_link
from rlinf.workers.embodied.rollout import PolicyRolloutConfig, PolicyRolloutWorker
from rlinf.workers.embodied.vla_policy import VLARolloutConfig, VLARolloutWorker
from rlinf.workers.env.link import ActionSource, ObsSink, stage_key
from rlinf.workers.errors import ConfigError
from rlinf.workers.rollout.offload import state_bytes
from rlinf.workers.runtime.context import WorkerContext
from rlinf.workers.telemetry import Span, TraceRecorder

__all__ = ["PING", "PolicyRole", "RolloutPolicy", "build_rollout_policy", "serve_stages"]

PING = "ping"
"""Link key of `EnvRole.ping` / `PolicyRole.echo` messages."""

RolloutPolicy = PolicyRolloutWorker | VLARolloutWorker
"""A policy that answers observation micro-batches (`infer`) and syncs weights."""


def build_rollout_policy(context: WorkerContext,
                         config: PolicyRolloutConfig | VLARolloutConfig) -> RolloutPolicy:
    """The MLP/CNN rollout worker or the VLA one, by config type."""
    if isinstance(config, VLARolloutConfig):
        return VLARolloutWorker(context, config=config)
    if isinstance(config, PolicyRolloutConfig):
        return PolicyRolloutWorker(context, config=config)
    raise ConfigError(f"expected a PolicyRolloutConfig or VLARolloutConfig, got "
                      f"{type(config).__name__}")


def serve_stages(policy: RolloutPolicy, *, source: ActionSource, sink: ObsSink, num_steps: int,
                 num_stages: int, timeout: float | None, trace: TraceRecorder) -> int:
    """The policy side of the env worker's protocol (``num_steps + 1`` batches per stage, the
    last for bootstrapping), with one ``infer`` span per stage group and step."""
    if num_steps < 1 or num_stages < 1:
        raise ConfigError(f"num_steps and num_stages must be >= 1, got {num_steps}, "
                          f"{num_stages}")
    answered = 0
    for step in range(num_steps + 1):
        for stage in range(num_stages):
            key = stage_key(stage)
            batch = source.get(key=key, timeout=timeout)
            start = time.time()
            sink.put(policy.infer(batch), key=key)
            trace.add("infer", start, time.time(), stage=stage, step=step)
            answered += 1
    return answered


class PolicyRole(RoleBase):
    """Runs rollout inference in its own process (module docstring)."""

    def __init__(self, context: WorkerContext, *, config: PolicyRolloutConfig | VLARolloutConfig,
                 link: RoleLink, trace: bool = False, num_threads: int | None = None) -> None:
        super().__init__(context, trace=trace, num_threads=num_threads)
        self.policy = build_rollout_policy(context, config)
        self.link = link
        self._ends: LinkEnds | None = None

    def open_link(self) -> None:
        """Open this side of the link (observations in, actions out)."""
        if self._ends is None:
            self._ends = open_link(self.link, inbound=self.link.observations,
                                   outbound=self.link.actions)

    def serve(self, *, num_steps: int, num_stages: int) -> list[Span]:
        """Answer one rollout of the env role; returns this call's spans."""
        if self._ends is None:
            raise ConfigError("PolicyRole.serve before open_link(): connect the roles first")
        with self.turn("serve", steps=num_steps):
            serve_stages(self.policy, source=self._ends.inbound, sink=self._ends.outbound,
                         num_steps=num_steps,
                         num_stages=num_stages, timeout=self.link.timeout, trace=self.trace)
        return self.drain_spans()

    def echo(self, *, count: int) -> None:
        """Send back `count` messages under key ``"ping"`` as they arrive (`EnvRole.ping`)."""
        if self._ends is None:
            raise ConfigError("PolicyRole.echo before open_link(): connect the roles first")
        for _ in range(count):
            self._ends.outbound.put(self._ends.inbound.get(key=PING, timeout=self.link.timeout),
                                    key=PING)

    def set_weights(self, weights: Weights) -> None:
        """Load the actor's parameters."""
        self.policy.set_weights(weights_from_wire(weights))

    def get_weights(self) -> dict[str, torch.Tensor]:
        """The serving parameters."""
        return self.policy.get_weights()

    def state(self) -> dict[str, Any]:
        """Weights and sampling-generator positions."""
        return self.policy.state()

    def load_state(self, state: Mapping[str, Any]) -> None:
        """Inverse of `state`."""
        self.policy.load_state(state)

    def resident_memory_bytes(self) -> int | None:
        """The policy's model."""
        model = getattr(self.policy, "model", None)
        return state_bytes(model) if isinstance(model, torch.nn.Module) else None

    def onload(self) -> None:
        """Move the model onto its device."""
        self.policy.onload()

    def offload(self) -> None:
        """Move the model to host memory."""
        self.policy.offload()

    def shutdown(self) -> None:
        """Disconnect the channels, then the base worker's resources."""
        if self._ends is not None:
            self._ends.close()
            self._ends = None
        super().shutdown()
