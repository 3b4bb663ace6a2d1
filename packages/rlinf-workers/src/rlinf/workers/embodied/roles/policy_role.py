"""`PolicyRole`: policy inference as its own flow component, serving an env role over the
edges of their loop — every env rank paired with it, their micro-batches of a stage group
batched into one inference."""

from __future__ import annotations

import contextlib
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from functools import partial
from typing import Any

import numpy as np
import torch

from rlinf.comm import Batch
from rlinf.workers.embodied.roles.weights import PolicyTarget
from rlinf.workers.embodied.rollout import PolicyRolloutConfig, PolicyRolloutWorker
from rlinf.workers.embodied.vla_policy import VLARolloutConfig, VLARolloutWorker
from rlinf.workers.env.group_threads import GroupThreads
from rlinf.workers.env.link import ActionSource, ObsSink, ScopedLink, stage_key
from rlinf.workers.errors import ConfigError
from rlinf.workers.flow import FlowChannel, StepContext, WeightReceiver
from rlinf.workers.rollout.offload import state_bytes
from rlinf.workers.runtime.context import WorkerContext
from rlinf.workers.telemetry import TraceRecorder
from rlinf.workers.weight_sync import WeightTarget

__all__ = ["PING", "PolicyRole", "RolloutPolicy", "build_rollout_policy", "env_scope",
           "serve_stages"]

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


def env_scope(rank: int) -> str:
    """The key scope of env rank `rank`'s messages where several env ranks run
    (`rlinf.workers.env.link.ScopedLink`)."""
    return f"e{rank}"


def _joined(batches: Sequence[Batch]) -> Batch:
    """One batch of the rows of `batches` (same fields, the first one's metadata)."""
    return Batch({n: np.concatenate([np.asarray(b.tensors[n]) for b in batches])
                  for n in batches[0].tensors}, meta=dict(batches[0].meta))


def _split(reply: Batch, rows: Sequence[int]) -> list[Batch]:
    cuts = np.cumsum(rows)[:-1]
    parts = {n: np.split(np.asarray(v), cuts) for n, v in reply.tensors.items()}
    return [Batch({n: parts[n][i] for n in parts}, meta=dict(reply.meta))
            for i in range(len(rows))]


def serve_stages(policy: RolloutPolicy, *, links: Sequence[tuple[ActionSource, ObsSink]],
                 num_steps: int, num_stages: int, timeout: float | None,
                 trace: TraceRecorder, concurrent: bool = False) -> int:
    """The policy side of the env worker's protocol (``num_steps + 1`` batches per stage, the
    last for bootstrapping) for every env rank in `links` (its source and sink): the stage
    group's batches of all of them answered by one inference, with one ``infer`` span per
    stage group and step. Stages take turns in order, or with `concurrent` (the env steps
    its groups concurrently: `EnvWorker.concurrent_groups`) each stage is served in its own
    thread as its batches arrive, one inference at a time. Returns the batches answered."""
    if num_steps < 1 or num_stages < 1 or not links:
        raise ConfigError(f"num_steps and num_stages must be >= 1 and at least one env served, "
                          f"got {num_steps}, {num_stages}, {len(links)} envs")
    if not concurrent or num_stages == 1:
        for step in range(num_steps + 1):
            for stage in range(num_stages):
                _answer(policy, links, stage, step, trace, get=_plain_get(timeout))
        return (num_steps + 1) * num_stages * len(links)
    threads = GroupThreads()
    inference = threading.Lock()  # one model, one inference at a time

    def serve(stage: int) -> None:
        get = partial(threads.get, timeout=timeout)
        for step in range(num_steps + 1):
            _answer(policy, links, stage, step, trace, get=get, lock=inference)

    threads.run([partial(serve, stage) for stage in range(num_stages)], name="policy-stage")
    return (num_steps + 1) * num_stages * len(links)


_Get = Callable[..., Batch]


def _plain_get(timeout: float | None) -> _Get:
    def get(source: ActionSource, *, key: str) -> Batch:
        return source.get(key=key, timeout=timeout)

    return get


def _answer(policy: RolloutPolicy, links: Sequence[tuple[ActionSource, ObsSink]], stage: int,
            step: int, trace: TraceRecorder, *, get: _Get,
            lock: threading.Lock | None = None) -> None:
    """Take stage `stage`'s batch of every env rank, answer them with one inference."""
    key = stage_key(stage)
    batches = [get(source, key=key) for source, _ in links]
    with lock or contextlib.nullcontext():
        start = time.time()
        if len(batches) == 1:
            replies = [policy.infer(batches[0])]
        else:
            replies = _split(policy.infer(_joined(batches)),
                             [len(np.asarray(b.tensors["obs"])) for b in batches])
        end = time.time()
    for (_, sink), reply in zip(links, replies, strict=True):
        sink.put(reply, key=key)
    trace.add("infer", start, end, stage=stage, step=step)


class PolicyRole(WeightReceiver):
    """Rollout inference in its own process: the policy side of an env ↔ policy loop.
    `concurrent_stages`: the env role steps its stage groups concurrently (its envs live in
    worker processes: `EnvWorker.concurrent_groups`), so each stage is served as its
    batches arrive rather than in turn (`serve_stages`)."""

    def __init__(self, context: WorkerContext, *, config: PolicyRolloutConfig | VLARolloutConfig,
                 trace: bool = False, num_threads: int | None = None,
                 io_timeout: float = 600.0, concurrent_stages: bool = False) -> None:
        super().__init__(context, trace=trace, io_timeout=io_timeout,
                         num_threads=num_threads or max(1, len(context.devices)))
        self.policy = build_rollout_policy(context, config)
        self.concurrent_stages = concurrent_stages

    def serve(self, ctx: StepContext, *, input_channel: FlowChannel,
              output_channel: FlowChannel) -> dict[str, float]:
        """Answer iteration ``ctx.step``'s rollout of the env ranks paired with this rank
        (`FlowChannel.peers`): ``ctx.loop_steps`` steps (+1 to bootstrap) of their stage
        groups (the env's items over the plan's micro-batch; every env rank runs that many,
        each an equal share of a group: `EnvWorkerConfig.shard`)."""
        env = input_channel.src
        env_ranks = ctx.ranks[env]
        stages = ctx.items[env] // ctx.micro_batch.get(env, ctx.items[env])
        sources, sinks = self.links(input_channel), self.links(output_channel)
        links: list[tuple[ActionSource, ObsSink]] = []
        for rank, source in sources.items():
            if env_ranks > 1:
                scope = env_scope(rank)
                links.append((ScopedLink(source, scope), ScopedLink(sinks[rank], scope)))
            else:
                links.append((source, sinks[rank]))
        with self.turn("serve", step=ctx.step):
            answered = serve_stages(self.policy, links=links,
                                    num_steps=ctx.loop_steps[self.role], num_stages=stages,
                                    timeout=self.io_timeout, trace=self.trace,
                                    concurrent=self.concurrent_stages)
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

