"""`RolloutRole`: generates an iteration's groups and streams each one out as it finishes."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping, Sequence
from typing import Any, Literal

import torch

from rlinf.comm import Channel
from rlinf.envs.math import MathProblem
from rlinf.workers.errors import ConfigError
from rlinf.workers.flow import FlowChannel, StepContext
from rlinf.workers.reasoning.groups import MicroBatches, pack_group
from rlinf.workers.reasoning.setup import RoleSetup, draw_seed
from rlinf.workers.reasoning.sync import WeightReceiverRole
from rlinf.workers.rollout import (
    HFRolloutEngine,
    RolloutBatch,
    RolloutEngine,
    RolloutGenerator,
    RolloutGeneratorConfig,
    SamplingConfig,
)
from rlinf.workers.rollout.offload import state_bytes
from rlinf.workers.rollout.tool_loop import ToolLoop, ToolLoopConfig
from rlinf.workers.runtime import WorkerContext
from rlinf.workers.weight_sync import WeightTarget

__all__ = ["EngineName", "ProblemBatches", "ProblemSource", "RolloutRole", "build_engine"]

EngineName = Literal["hf", "vllm", "sglang"]

ProblemSource = Callable[[int, int], Sequence[MathProblem]]
"""``problems(step, count)``: the `count` problems of iteration `step`, a pure function (e.g.
``ProblemGenerator(config).batch``), so a rollout worker draws its own prompts and every
rank, placement or resumed run reads the same ones."""


@dataclasses.dataclass(frozen=True)
class ProblemBatches:
    """A `ProblemSource` of batches given up front: iteration ``k`` reads ``batches[k]`` (for
    tests and benchmarks that feed every contender the same problems)."""

    batches: tuple[tuple[MathProblem, ...], ...]
    """One batch per iteration, indexed by step."""

    def __post_init__(self) -> None:
        object.__setattr__(self, "batches", tuple(tuple(b) for b in self.batches))

    def __call__(self, step: int, count: int) -> Sequence[MathProblem]:
        """``batches[step]``, which must hold `count` problems."""
        if not 0 <= step < len(self.batches):
            raise ConfigError(f"no batch for iteration {step}: {len(self.batches)} given")
        batch = self.batches[step]
        if len(batch) != count:
            raise ConfigError(f"iteration {step} runs {count} groups, but its batch holds "
                              f"{len(batch)} problems")
        return batch


def build_engine(
    engine: EngineName, setup: RoleSetup, *, device: Any, model_path: str | None,
    seed: int, options: Mapping[str, Any],
) -> tuple[RolloutEngine, Any]:
    """The rollout engine and tokenizer; vLLM and SGLang load the HF checkpoint at
    `model_path` (the tokenizer always comes from the model factory)."""
    model, tokenizer = setup.model_factory()
    if engine == "hf":
        # "host" keeps the weights across a context switch (a no-op on CPU); "discard"
        # (engine_options) frees more but needs a weight sync before the next generate.
        options = {"offload_policy": "host", "precision": setup.precision, **options}
        return HFRolloutEngine(model, eos_token_id=int(tokenizer.eos_token_id),
                               pad_token_id=int(tokenizer.pad_token_id), device=device,
                               **options), tokenizer
    if model_path is None:
        raise ConfigError(f"the {engine} engine loads a Hugging Face checkpoint folder: pass "
                          "model_path (config.json + weights + tokenizer)")
    del model
    options = {"dtype": "bfloat16" if setup.precision == "bf16" else "float32", **options}
    if engine == "vllm":
        from rlinf.workers.rollout import VllmRolloutEngine

        return VllmRolloutEngine(model_path, seed=seed, **options), tokenizer
    if engine == "sglang":
        from rlinf.workers.rollout import SglangRolloutEngine

        return SglangRolloutEngine(model_path, seed=seed, **options), tokenizer
    raise ConfigError(f"engine must be 'hf', 'vllm' or 'sglang', got {engine!r}")


class RolloutRole(WeightReceiverRole):
    """Rollout rank: its share of an iteration's micro-batches, groups streamed to reward."""

    def __init__(
        self, context: WorkerContext, *, setup: RoleSetup, config: RolloutGeneratorConfig,
        engine: EngineName = "hf", model_path: str | None = None,
        engine_options: Mapping[str, Any] | None = None,
        problems: ProblemSource | None = None, tools: ToolLoopConfig | None = None,
    ) -> None:
        super().__init__(context, setup=setup)
        self.problems = problems
        self.engine_name = engine
        built, tokenizer = build_engine(engine, setup, device=self.device,
                                        model_path=model_path, seed=setup.seed,
                                        options=dict(engine_options or {}))
        if tools is not None:
            # Multi-turn: every generation (training, evaluation, probes) may call tools.
            built = ToolLoop.build(built, tokenizer, tools)
        self.worker = RolloutGenerator(built, tokenizer, config=config)
        self.config = config

    # -- generation ------------------------------------------------------------------------

    def rollout_step(self, ctx: StepContext, *, output_channel: FlowChannel) -> dict[str, float]:
        """Flow entry (`rlinf.workers.flow`): draw iteration ``ctx.step``'s problems from
        the `problems` source, generate this rank's micro-batches, and put each group into
        `output_channel` as its micro-batch finishes. Returns this rank's statistics."""
        if self.problems is None:
            raise ConfigError("RolloutRole needs problems= (a ProblemSource) to run as a flow "
                              "component: it draws its own prompts")
        if output_channel.unit != self.config.group_size:
            raise ConfigError(f"channel {output_channel.edge} carries units of "
                              f"{output_channel.unit} items, the rollout groups of "
                              f"{self.config.group_size}: declare the consumer's Component "
                              "with micro_batch_multiple=group_size")
        groups = output_channel.units(ctx.items[self.role])
        plan = MicroBatches(groups=groups, ranks=self.world_size,
                            groups_per_micro_batch=self.config.groups_per_micro_batch)
        stats = self._generate(ctx.step, self.problems(ctx.step, groups),
                               self.channel(output_channel), plan=plan,
                               key_of=lambda index: output_channel.key_of(index, groups))
        stats["response_length"] = stats["response_tokens"] / max(stats["responses"], 1.0)
        return stats

    def _generate(self, step: int, problems: Sequence[MathProblem], channel: Channel, *,
                  plan: MicroBatches, key_of: Callable[[int], str]) -> dict[str, float]:
        if len(problems) != plan.groups:
            raise ConfigError(f"iteration {step} has {plan.groups} groups but the problem "
                              f"source returned {len(problems)} problems")
        cfg = self.config
        stats = {"groups": 0.0, "responses": 0.0, "response_tokens": 0.0, "stopped": 0.0}
        if isinstance(self.worker.engine, ToolLoop):
            stats.update(turns=0.0, tool_calls=0.0, tool_errors=0.0, tool_seconds=0.0,
                         tool_tokens=0.0)
        with self.turn("generate", step=step):
            for k in plan.of_rank(self.rank):
                indices = plan.groups_of(k)
                sampling = dataclasses.replace(cfg.sampling,
                                               seed=draw_seed(self.setup.seed, step, k))
                groups: list[RolloutBatch] = []
                with self.trace.span("micro_batch", step=step, index=k, groups=len(indices)), \
                        self.timed_call(len(indices) * cfg.group_size):
                    self.worker.rollout([problems[i] for i in indices], sink=groups.append,
                                        sampling=sampling)
                for index, group in zip(indices, groups, strict=True):
                    channel.put(pack_group(group, index=index, step=step),
                                weight=group.num_rows, key=key_of(index))
                    stats["groups"] += 1
                    stats["responses"] += group.num_rows
                    stats["response_tokens"] += float(group.response_mask.sum())
                    stats["stopped"] += float(group.stopped.sum())
                    if group.tool_mask is not None:
                        stats["tool_tokens"] += float(group.tool_mask.sum())
                        for name in ("turns", "tool_calls", "tool_errors", "tool_seconds"):
                            stats[name] += float(getattr(group, name).sum())
        return stats

    def generate_batch(self, problems: Sequence[MathProblem], *,
                       sampling: SamplingConfig | None = None) -> RolloutBatch:
        """All groups for `problems` in one batch (probes, evaluation, profiling)."""
        with self.turn("generate_batch", problems=len(problems)):
            return self.worker.generate_batch(problems, sampling=sampling)

    def greedy_batch(self, problems: Sequence[MathProblem], *,
                     max_new_tokens: int) -> RolloutBatch | None:
        """One greedy response per problem (held-out evaluation); None without problems.
        The reward role scores them: its process has the verifier warmed up, and this one,
        which may never score otherwise, is spared math-verify's start-up."""
        if not problems:
            return None
        greedy = SamplingConfig(max_new_tokens=max_new_tokens, temperature=0.0)
        single = dataclasses.replace(self.config, group_size=1)
        worker = RolloutGenerator(self.worker.engine, self.worker.tokenizer, config=single)
        with self.turn("evaluate", problems=len(problems)):
            return worker.generate_batch(problems, sampling=greedy)

    # -- weights and context switching -----------------------------------------------------

    def weight_target(self) -> WeightTarget:
        """The engine loads the buckets."""
        return self.worker

    def adapted_module(self) -> torch.nn.Module | None:
        """The HF engine's model, which keeps its base weights (``host`` offload); None for
        engines that load weights their own way (vLLM, SGLang take merged weights)."""
        engine = self.worker.engine
        inner = engine.engine if isinstance(engine, ToolLoop) else engine
        if not isinstance(inner, HFRolloutEngine):
            return None
        if inner.offload_policy == "discard":
            raise ConfigError("an adapters-only weight sync needs the rollout's base weights "
                              "kept across offloads: use the HF engine's 'host' offload "
                              "policy, or sync merged weights")
        return inner.model

    def resident_memory_bytes(self) -> int | None:
        """The engine's model when it exposes one as a torch module (HF); None for engines
        that manage their own memory (vLLM, SGLang)."""
        model = getattr(self.worker.engine, "model", None)
        return state_bytes(model) if isinstance(model, torch.nn.Module) else None

    def onload(self) -> None:
        """Bring the engine back (its weights are refilled by the next sync)."""
        self.worker.onload()

    def offload(self) -> None:
        """Free the engine's memory for the role that takes the device."""
        self.worker.offload()

    def shutdown(self) -> None:
        """Stop the engine (vLLM / SGLang hold resources), then the base cleanup."""
        stop = getattr(self.worker.engine, "shutdown", None)
        if callable(stop):
            stop()
        super().shutdown()

