"""`RolloutGenerator`: math problems in, groups of sampled responses streamed out.

Elastic pipelining: the problems are generated in micro-batches of
``groups_per_micro_batch`` prompts (each repeated ``group_size`` times) and every group is
handed to the sink the moment its micro-batch finishes, so the reward and inference stages
start on the first groups while later ones are still being generated. Smaller micro-batches
mean earlier first output, larger ones better generation throughput; the planner picks.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol, runtime_checkable

import structlog
from transformers import PreTrainedTokenizerBase

from rlinf.envs.math import MathProblem, format_chat, format_prompt
from rlinf.envs.math.templates import DEFAULT_SYSTEM_PROMPT, TemplateName
from rlinf.workers.errors import ConfigError
from rlinf.workers.rollout.batch import RolloutBatch
from rlinf.workers.rollout.types import NamedTensors, RolloutEngine, SamplingConfig

__all__ = ["GroupSink", "RolloutGenerator", "RolloutGeneratorConfig", "RolloutStats",
           "encode_prompt"]

_log = structlog.get_logger(__name__)


@runtime_checkable
class GroupSink(Protocol):
    """Where finished groups go: a queue-like object (an `rlinf.comm` Channel fits)."""

    def put(self, item: Any, *, weight: float = 1) -> None:
        """Append one item; `weight` is its number of responses."""
        ...


Sink = GroupSink | Callable[[RolloutBatch], object]
"""A `GroupSink` receives ``RolloutBatch.to_batch()`` (a `rlinf.comm.Batch`, what channels
carry); a plain callable receives the `RolloutBatch` itself (in-process pipelines)."""


@dataclass(frozen=True)
class RolloutGeneratorConfig:
    """What the rollout worker generates per problem."""

    group_size: int = 4
    """Responses sampled per prompt (GRPO's group)."""
    groups_per_micro_batch: int = 4
    """Prompts generated together before their groups are emitted."""
    sampling: SamplingConfig = field(default_factory=SamplingConfig)
    """Sampling options passed to the engine."""
    template: TemplateName = "short"
    """Prompt template of `rlinf.envs.math.format_prompt` ("short" for tiny char models);
    "chat" applies the tokenizer's chat template to `rlinf.envs.math.format_chat`'s messages
    and is refused for a tokenizer without one."""
    system_prompt: str | None = DEFAULT_SYSTEM_PROMPT
    """The system message of the "chat" template (None: none; the other templates have no
    system part)."""
    problem_columns: bool = False
    """Carry each group's prompt and dataset columns to the reward (`RolloutBatch.prompts`,
    `RolloutBatch.columns`): reward functions of the batch and veRL shapes read them."""

    def __post_init__(self) -> None:
        if self.group_size < 1 or self.groups_per_micro_batch < 1:
            raise ConfigError(f"group_size and groups_per_micro_batch must be >= 1, got "
                              f"{self.group_size} and {self.groups_per_micro_batch}")


@dataclass(frozen=True)
class RolloutStats:
    """Summary of one `RolloutGenerator.rollout` call."""

    groups: int
    """Groups emitted."""
    responses: int
    """Responses emitted (groups x group_size)."""
    response_tokens: int
    """Generated tokens, EOS included."""
    stopped_fraction: float
    """Share of responses that ended with EOS rather than the length limit."""


def encode_prompt(problem: MathProblem, tokenizer: PreTrainedTokenizerBase, *,
                  template: TemplateName, system_prompt: str | None = DEFAULT_SYSTEM_PROMPT
                  ) -> list[int]:
    """Token ids of `problem` under `template` (`RolloutGenerator.encode_prompt`): what the
    model sees; decoded, what a run prints as its first prompt. A problem whose prompt came
    as chat messages (veRL's layout) goes through the tokenizer's chat template whatever
    `template` says, when the tokenizer has one."""
    if template == "chat" or (problem.messages and getattr(tokenizer, "chat_template", None)):
        text = tokenizer.apply_chat_template(
            format_chat(problem, system_prompt=system_prompt), add_generation_prompt=True,
            tokenize=False)
        assert isinstance(text, str)
        return list(tokenizer(text, add_special_tokens=False)["input_ids"])
    text = format_prompt(problem, template=template, system_prompt=system_prompt)
    return list(tokenizer(text, add_special_tokens=True)["input_ids"])


class RolloutGenerator:
    """Generates grouped responses with a `RolloutEngine` (see the module docstring)."""

    def __init__(
        self, engine: RolloutEngine, tokenizer: PreTrainedTokenizerBase, *,
        # frozen: a shared default is safe
        config: RolloutGeneratorConfig = RolloutGeneratorConfig(),
    ) -> None:
        if tokenizer.pad_token_id is None:
            raise ConfigError("the tokenizer needs a pad token (prompts are left-padded)")
        if config.template == "chat" and not getattr(tokenizer, "chat_template", None):
            raise ConfigError(
                f"template 'chat' renders prompts with the tokenizer's chat template, and "
                f"this {type(tokenizer).__name__} has none: use template 'plain' for a base "
                "model, or load a chat model's folder (its tokenizer_config.json carries one)")
        self.engine = engine
        self.tokenizer = tokenizer
        self.config = config

    def encode_prompt(self, problem: MathProblem) -> list[int]:
        """Token ids of `problem` under the configured template; ``chat`` goes through the
        tokenizer's own chat template (system and user messages, generation prompt), whose
        text already holds the special tokens the model expects."""
        return encode_prompt(problem, self.tokenizer, template=self.config.template,
                             system_prompt=self.config.system_prompt)

    def rollout(
        self, problems: Sequence[MathProblem], *, sink: Sink,
        sampling: SamplingConfig | None = None,
    ) -> RolloutStats:
        """Generate ``group_size`` responses per problem, emitting each group as it finishes.

        `sampling` overrides the configured options for this call. With a seed, micro-batch
        ``i`` samples with ``seed + i`` so the batches are reproducible but not identical.
        """
        cfg = self.config
        base = sampling or cfg.sampling
        put = _as_put(sink)
        groups = responses = tokens = stopped = 0
        step = cfg.groups_per_micro_batch
        for index, start in enumerate(range(0, len(problems), step)):
            chunk = problems[start:start + step]
            prompts = [ids for p in chunk for ids in [self.encode_prompt(p)] * cfg.group_size]
            call = base if base.seed is None else dataclasses.replace(base, seed=base.seed + index)
            samples = self.engine.generate(prompts, sampling=call)
            for g, problem in enumerate(chunk):
                rows = samples[g * cfg.group_size:(g + 1) * cfg.group_size]
                carried = cfg.problem_columns
                group = RolloutBatch.from_samples(
                    rows, answers=[problem.answer] * cfg.group_size, group_size=cfg.group_size,
                    pad_token_id=int(self.tokenizer.pad_token_id),  # type: ignore[arg-type]
                    prompts=[problem.prompt] if carried else (),
                    columns=[problem.dataset_columns] if carried else ())
                put(group)
                groups += 1
                responses += len(rows)
                tokens += int(group.response_mask.sum())
                stopped += int(group.stopped.sum())
            _log.debug("rollout_micro_batch_done", index=index, groups=groups)
        return RolloutStats(groups=groups, responses=responses, response_tokens=tokens,
                            stopped_fraction=stopped / responses if responses else 0.0)

    def generate_batch(
        self, problems: Sequence[MathProblem], *, sampling: SamplingConfig | None = None
    ) -> RolloutBatch:
        """All groups of `rollout` gathered into one batch (for callers that do not stream)."""
        collected: list[RolloutBatch] = []
        self.rollout(problems, sink=collected.append, sampling=sampling)
        return RolloutBatch.concat(collected, pad_token_id=int(self.tokenizer.pad_token_id))  # type: ignore[arg-type]

    def update_weights(self, named_tensors: NamedTensors) -> None:
        """Load new policy weights into the engine (a bucket or all of them)."""
        self.engine.update_weights(named_tensors)

    def offload(self) -> None:
        """Free the engine's device memory (`rlinf.sched.Onloadable`)."""
        self.engine.offload()

    def onload(self) -> None:
        """Bring the engine back (`rlinf.sched.Onloadable`)."""
        self.engine.onload()


def _as_put(sink: Sink) -> Callable[[RolloutBatch], object]:
    if isinstance(sink, GroupSink):
        queue = sink

        def put(group: RolloutBatch) -> None:
            queue.put(group.to_batch(), weight=group.num_rows)

        return put
    if callable(sink):
        return sink
    raise ConfigError(f"sink must have put(item, weight=...) or be callable, got "
                      f"{type(sink).__name__}")
