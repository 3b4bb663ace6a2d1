"""Toy flow components shared by the flow tests: no model, so their processes start fast.

`Source` puts one numbered unit per item into its output channel, `Relay` passes units on,
`Sink` (contiguous shards, like a trainer) sums what it receives and counts its "steps";
`Sink` also implements the weight-sender methods and `Source` the receiver methods, with
a version number standing in for the weights.
"""

from __future__ import annotations

import os
import sys
import time
from typing import Any, ClassVar

import numpy as np
import ray

from rlinf.comm import Batch
from rlinf.workers.flow import FlowChannel, FlowWorker, Sharding, StepContext
from rlinf.workers.flow.channels import rank_key
from rlinf.workers.runtime import WorkerContext

# Test modules are not importable in Ray's worker processes: ship these classes by value.
ray.cloudpickle.register_pickle_by_value(sys.modules[__name__])


class Switching(FlowWorker):
    """Counts its context switches (an `rlinf.sched.Onloadable`)."""

    def __init__(self, context: WorkerContext, **kwargs: Any) -> None:
        super().__init__(context, **kwargs)
        self.loads = 0

    def onload(self) -> None:
        self.loads += 1

    def offload(self) -> None:
        pass


class Source(Switching):
    """Produces units ``0..total-1`` (this rank's share) and receives 'weights'."""

    def __init__(self, context: WorkerContext, *, delay: float = 0.0, fail_init: bool = False,
                 **kwargs: Any) -> None:
        super().__init__(context, **kwargs)
        if fail_init:
            raise RuntimeError("the source refuses to start")
        self.delay = delay
        self.version = -1

    def produce(self, ctx: StepContext, *, output_channel: FlowChannel) -> dict[str, float]:
        channel = self.channel(output_channel)
        total = output_channel.units(ctx.items[self.role])
        mine = range(self.rank, total, ctx.ranks[self.role])
        for index in mine:
            with self.turn("produce", index=index):
                time.sleep(self.delay)  # stands in for work
                unit = np.full(output_channel.unit, index, dtype=np.int64)
                channel.put(Batch({"x": unit}, meta={"step": ctx.step}), weight=output_channel.unit,
                            key=output_channel.key_of(index, total))
        return {"produced": float(len(mine)), "version": float(self.version)}

    # receiver half of weight sync
    def receive_weights(self, transport: str, payload: list[Any]) -> int:
        with self.turn("receive_weights"):
            self.version = int(payload[0])
        return len(payload)

    def join_weight_group(self, **kwargs: Any) -> None:
        pass


def _take(worker: FlowWorker, channel: FlowChannel, ctx: StepContext,
          steps: set[int] | None = None) -> list[int]:
    """This rank's units of `channel` (and, into `steps`, the iterations that produced them)."""
    handle = worker.channel(channel)
    total = channel.units(ctx.items[worker.role])
    left = len(channel.indices(worker.rank, total))
    got: list[int] = []
    while left:
        take = min(channel.units_per_message, left)
        items = handle.get_batch(target_weight=take * channel.unit, key=rank_key(worker.rank),
                                 timeout=worker.io_timeout)
        got += [int(item.tensors["x"][0]) for item in items]
        if steps is not None:
            steps.update(int(item.meta.get("step", -1)) for item in items)
        left -= len(items)
    return got


class Relay(Switching):
    """Passes every unit on."""

    def relay(self, ctx: StepContext, *, input_channel: FlowChannel,
              output_channel: FlowChannel) -> dict[str, float]:
        out = self.channel(output_channel)
        total = output_channel.units(ctx.items[output_channel.dst])
        got = _take(self, input_channel, ctx)
        with self.turn("relay", units=len(got)):
            for index in got:
                out.put(Batch({"x": np.full(output_channel.unit, index, dtype=np.int64)}),
                        weight=output_channel.unit, key=output_channel.key_of(index, total))
        return {"relayed": float(len(got)), "version": float(getattr(self, "version", -1))}


class ReceivingRelay(Relay):
    """A `Relay` that also receives 'weights' (a version number, as `Source`)."""

    def __init__(self, context: WorkerContext, **kwargs: Any) -> None:
        super().__init__(context, **kwargs)
        self.version = -1

    def receive_weights(self, transport: str, payload: list[Any]) -> int:
        with self.turn("receive_weights"):
            self.version = int(payload[0])
        return len(payload)

    def join_weight_group(self, **kwargs: Any) -> None:
        pass


class Sink(Switching):
    """Receives its contiguous shard; a trainer stand-in with a 'weights' version."""

    input_sharding: ClassVar[Sharding] = "contiguous"

    def __init__(self, context: WorkerContext, *, exit_on_step: int | None = None,
                 delay: float = 0.0, **kwargs: Any) -> None:
        super().__init__(context, **kwargs)
        self.exit_on_step = exit_on_step
        self.delay = delay
        self.version = 0
        self.ready = False

    def build(self) -> None:
        self.ready = True

    def consume(self, ctx: StepContext, *, input_channel: FlowChannel) -> dict[str, float]:
        if ctx.step == self.exit_on_step:
            os._exit(3)  # a rank that dies mid-iteration
        steps: set[int] = set()
        got = _take(self, input_channel, ctx, steps)
        with self.turn("consume", units=len(got)), \
                self.timed_call(len(got) * input_channel.unit):
            time.sleep(self.delay)  # stands in for training
            self.version += 1
        total = input_channel.units(ctx.items[self.role])
        expected = list(input_channel.indices(self.rank, total))
        # The iteration that produced the data: the one this call runs, or (policy lag)
        # the one before; -1 when it is mixed or unknown.
        data_step = steps.pop() if len(steps) == 1 else -1
        return {"sum": float(sum(got)), "in_order": float(sorted(got) == expected),
                "ready": float(self.ready), "data_step": float(data_step)}

    # sender half of weight sync
    def export_weights(self, transport: str) -> list[Any]:
        return [self.version] if self.rank == 0 else []

    def release_weights(self, handles: list[Any]) -> None:
        pass

    def broadcast_weights(self) -> None:
        pass

    def weight_group_address(self) -> tuple[str, int]:
        return "127.0.0.1", 0

    def join_weight_group(self, **kwargs: Any) -> None:
        pass


class LoopEnv(Source):
    """An env ↔ policy loop's env: each step adds 1 to every observation and asks the policy
    (its channel peer, or itself when the policy is inlined) for actions; after the loop it
    puts one unit per env into the trainer's channel. Reports the sum of all actions."""

    def __init__(self, context: WorkerContext, *, inline_offset: int | None = None,
                 **kwargs: Any) -> None:
        super().__init__(context, **kwargs)
        self.inline_offset = inline_offset

    def rollout(self, ctx: StepContext, *, inputs: dict[str, FlowChannel],
                outputs: dict[str, FlowChannel]) -> dict[str, float]:
        inline = "policy" in ctx.inlined
        if inline != (self.inline_offset is not None) or inline == ("policy" in outputs):
            raise AssertionError(f"inline {inline} but offset {self.inline_offset} and "
                                 f"outputs {sorted(outputs)}")
        obs = np.arange(ctx.items[self.role], dtype=np.int64) + 100 * ctx.step
        total = 0
        for _ in range(ctx.loop_steps[self.role]):
            with self.turn("env_step"):
                obs = obs + 1
            if self.inline_offset is not None:
                with self.turn("infer", component="policy"):
                    actions = act(obs, self.inline_offset, self.version)
            else:
                self.link(outputs["policy"]).put(Batch({"obs": obs}), key=rank_key(0))
                reply = self.link(inputs["policy"]).get(key=rank_key(0),
                                                           timeout=self.io_timeout)
                actions = np.array(reply.tensors["action"])
            total += int(actions.sum())
        trainer = outputs["actor"]
        units = trainer.units(ctx.items["actor"])
        for index in range(units):
            trainer_channel = self.channel(trainer)
            trainer_channel.put(Batch({"x": np.full(trainer.unit, index, dtype=np.int64)},
                                      meta={"step": ctx.step}),
                                weight=trainer.unit, key=trainer.key_of(index, units))
        return {"action_sum": float(total)}


def act(obs: np.ndarray, offset: int, version: int) -> np.ndarray:
    """The toy policy: what LoopPolicy and an inlining LoopEnv both compute."""
    return 2 * obs + offset + version


class LoopPolicy(Source):
    """The loop's policy in its own process: answers each observation batch."""

    def __init__(self, context: WorkerContext, *, offset: int, **kwargs: Any) -> None:
        super().__init__(context, **kwargs)
        self.offset = offset

    def serve(self, ctx: StepContext, *, input_channel: FlowChannel,
              output_channel: FlowChannel) -> dict[str, float]:
        source, sink = self.link(input_channel), self.link(output_channel)
        for _ in range(ctx.loop_steps[self.role]):
            batch = source.get(key=rank_key(0), timeout=self.io_timeout)
            with self.turn("infer"):
                actions = act(np.asarray(batch.tensors["obs"]), self.offset, self.version)
            sink.put(Batch({"action": actions}), key=rank_key(0))
        return {"served": float(ctx.loop_steps[self.role])}


class TrainingRelay(Relay, Sink):
    """A relay that also sends weights: a trainer whose data feeds another component."""
