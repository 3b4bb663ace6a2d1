"""`InferenceRole`: old (and reference) log-probs of groups as they arrive."""

from __future__ import annotations

import copy
import dataclasses
from collections.abc import Callable, Iterable

import torch

from rlinf.comm import Channel
from rlinf.workers.errors import ConfigError
from rlinf.workers.flow import FlowChannel, StepContext
from rlinf.workers.inference import InferenceConfig, LogProbEngine
from rlinf.workers.models.attention import AttentionChoice
from rlinf.workers.reasoning.groups import pack_group
from rlinf.workers.reasoning.setup import RoleSetup
from rlinf.workers.reasoning.sync import WeightReceiverRole
from rlinf.workers.rollout.batch import RolloutBatch
from rlinf.workers.rollout.offload import state_bytes
from rlinf.workers.runtime import WorkerContext
from rlinf.workers.weight_sync import WeightTarget

__all__ = ["InferenceRole"]


class InferenceRole(WeightReceiverRole):
    """Inference rank: ``old_log_probs`` under the current policy (it follows the actor's
    weights) and, with `reference`, ``ref_log_probs`` under the frozen initial policy."""

    def __init__(
        self, context: WorkerContext, *, setup: RoleSetup, temperature: float,
        micro_batch_size: int = 16, recompute: bool = True, reference: bool = False,
        attention: AttentionChoice = "auto", padding_free: bool = True,
    ) -> None:
        """`attention` and `padding_free` as the actor trains (`ActorConfig`), so that its
        first ratio on a batch is exactly 1."""
        super().__init__(context, setup=setup)
        if not (recompute or reference):
            raise ConfigError("an inference role needs recompute=True or reference=True")
        model, _ = setup.model_factory()
        base = InferenceConfig(micro_batch_size=micro_batch_size, temperature=temperature,
                               precision=setup.precision, attention=attention,
                               padding_free=padding_free)
        self.policy = LogProbEngine(copy.deepcopy(model) if reference else model,
                                      config=base, device=self.device) if recompute else None
        self.reference = LogProbEngine(
            model, config=dataclasses.replace(base, role="reference"),
            device=self.device) if reference else None
        self.offload()  # components start offloaded: the first turn onloads

    def annotate(self, group: RolloutBatch) -> RolloutBatch:
        """`group` with its old and/or reference log-probs."""
        if self.policy is not None:
            group = self.policy.annotate(group)
        if self.reference is not None:
            group = self.reference.annotate(group)
        return group

    def inference_step(self, ctx: StepContext, *, input_channel: FlowChannel,
                       output_channel: FlowChannel) -> dict[str, float]:
        """Flow entry (`rlinf.workers.flow`): annotate this rank's groups of iteration
        ``ctx.step`` as they arrive on `input_channel` and pass them on to
        `output_channel`. Returns the groups annotated."""
        onward = output_channel.units(ctx.items[output_channel.dst])
        messages = self.receive_shard(ctx, input_channel)
        done = self._annotate_stream(ctx.step, messages, self.channel(output_channel),
                                     key_of=lambda index: output_channel.key_of(index, onward))
        return {"groups": float(done)}

    def _annotate_stream(self, step: int, messages: Iterable[list[tuple[int, RolloutBatch]]],
                         out: Channel, *, key_of: Callable[[int], str]) -> int:
        done = 0
        for message in messages:
            rows = sum(group.num_rows for _, group in message)
            with self.turn("inference", step=step, groups=len(message)), \
                    self.timed_call(rows):
                for index, group in message:
                    annotated = self.annotate(group)
                    out.put(pack_group(annotated, index=index, step=step),
                            weight=annotated.num_rows, key=key_of(index))
                    done += 1
        return done

    def log_probs(self, batch: RolloutBatch) -> RolloutBatch:
        """`batch` annotated (for probes and profiling)."""
        with self.turn("inference", rows=batch.num_rows):
            return self.annotate(batch)

    def adapted_module(self) -> torch.nn.Module | None:
        """The policy copy (adapters are merged into it)."""
        return None if self.policy is None else self.policy.model

    def weight_target(self) -> WeightTarget:
        """The policy copy follows the actor."""
        if self.policy is None:
            raise ConfigError("this inference role only scores the reference; it takes no "
                              "weights")
        return self.policy

    def resident_memory_bytes(self) -> int | None:
        """The policy copy and the reference model."""
        return state_bytes(*(w.model for w in (self.policy, self.reference) if w is not None))

    def onload(self) -> None:
        """Move the models back onto the device."""
        for worker in (self.policy, self.reference):
            if worker is not None:
                worker.onload()

    def offload(self) -> None:
        """Move the models to host memory."""
        for worker in (self.policy, self.reference):
            if worker is not None:
                worker.offload()
