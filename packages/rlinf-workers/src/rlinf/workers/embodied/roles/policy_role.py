"""`PolicyRole`: policy inference as its own flow component, serving an env role over the
edges of their loop."""

from __future__ import annotations

import time
from collections.abc import Mapping
from typing import Any

import torch

from rlinf.workers.embodied.roles.base import PolicyTarget, RoleBase
from rlinf.workers.embodied.rollout import PolicyRolloutConfig, PolicyRolloutWorker
from rlinf.workers.embodied.vla_policy import VLARolloutConfig, VLARolloutWorker
from rlinf.workers.env.link import ActionSource, ObsSink, stage_key
from rlinf.workers.errors import ConfigError
from rlinf.workers.flow import FlowChannel, StepContext, WeightReceiver
from rlinf.workers.rollout.offload import state_bytes
from rlinf.workers.runtime.context import WorkerContext
from rlinf.workers.telemetry import TraceRecorder
from rlinf.workers.weight_sync import WeightTarget

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


class PolicyRole(RoleBase, WeightReceiver):
    """Rollout inference in its own process: the policy side of an env ↔ policy loop."""

    def __init__(self, context: WorkerContext, *, config: PolicyRolloutConfig | VLARolloutConfig,
                 trace: bool = False, num_threads: int | None = None,
                 io_timeout: float = 600.0) -> None:
        super().__init__(context, trace=trace, num_threads=num_threads, io_timeout=io_timeout)
        self.policy = build_rollout_policy(context, config)

    def serve(self, ctx: StepContext, *, input_channel: FlowChannel,
              output_channel: FlowChannel) -> dict[str, float]:
        """Answer iteration ``ctx.step``'s rollout of the env at the other end of the loop:
        ``ctx.loop_steps`` steps (+1 to bootstrap) of its stage groups (its items over the
        plan's micro-batch)."""
        env = input_channel.src
        stages = ctx.items[env] // ctx.micro_batch.get(env, ctx.items[env])
        with self.turn("serve", step=ctx.step):
            answered = serve_stages(self.policy, source=self.link(input_channel),
                                    sink=self.link(output_channel),
                                    num_steps=ctx.loop_steps[self.role], num_stages=stages,
                                    timeout=self.io_timeout, trace=self.trace)
        return {"answered": float(answered)}

    def echo(self, *, count: int, input_channel: FlowChannel,
             output_channel: FlowChannel) -> None:
        """Send back `count` messages under key ``"ping"`` as they arrive (`EnvRole.ping`)."""
        source, sink = self.link(input_channel), self.link(output_channel)
        for _ in range(count):
            sink.put(source.get(key=PING, timeout=self.io_timeout), key=PING)

    def weight_target(self) -> WeightTarget:
        """The policy: the trainer's weights load into it."""
        return PolicyTarget(self.policy)

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

