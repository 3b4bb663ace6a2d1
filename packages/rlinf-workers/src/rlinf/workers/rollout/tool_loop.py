"""`ToolLoop`: multi-turn generation with tools, as a `RolloutEngine` around another one.

Each turn generates for every trajectory still going, in one batched call to the inner
engine, stopping at EOS or at a tool call's closing tag (`ToolFormat.stop_sequences`).
The calls of every trajectory that stopped on a tag run together (a thread pool: the
sandbox's calls are processes of their own), their observations are appended as tokens,
and the next turn generates from the longer contexts — up to ``max_turns`` turns. A
trajectory leaves the loop when it ends without a call.

The response a trajectory returns is every token after its prompt: the model's turns and
the tools' observations between them, with `RolloutSample.tool_mask` True on the
observations (log-prob 0 there) so the loss and the KL leave them out, and its turns,
calls, errors and tool time. The model's own tokens are kept as ids and never
re-tokenized, so the trainer scores exactly what was sampled.

Each turn reuses the last one's work where the engine allows: the HF engine continues
from the contexts and KV cache it kept (`HFRolloutEngine.continue_generation`), so only the
observations are computed before sampling on; vLLM's prefix cache (on in
`VllmRolloutEngine`) serves each turn's context from the last.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

import structlog
from transformers import PreTrainedTokenizerBase

from rlinf.envs.tools import (
    SandboxLimits,
    ToolCall,
    ToolRegistry,
    ToolResult,
    default_tools,
    load_tool,
)
from rlinf.workers.errors import ConfigError
from rlinf.workers.rollout.tool_formats import ToolFormat, ToolFormatName, make_tool_format
from rlinf.workers.rollout.types import (
    FinishReason,
    NamedTensors,
    RolloutEngine,
    RolloutSample,
    SamplingConfig,
)

__all__ = ["ToolLoop", "ToolLoopConfig", "ToolLoopStats"]

_log = structlog.get_logger(__name__)

_TURN_SEED_STRIDE = 100_003
"""Seed offset between turns of one call (a turn must not replay the previous one's draws)."""


@dataclass(frozen=True)
class ToolLoopConfig:
    """Which tools a trajectory may call, how it writes them, how far it may go."""

    tools: tuple[str, ...] = ("calculator",)
    """Tools by name: ``calculator``, ``python`` (the sandbox), or a user's function as
    ``module:function`` (`rlinf.envs.tools.load_tool`: schema from its annotations)."""
    format: ToolFormatName = "tags"
    """How calls and answers are written (`rlinf.workers.rollout.tool_formats`)."""
    sandbox: SandboxLimits = field(default_factory=SandboxLimits)
    """Limits of each ``python`` call."""
    max_turns: int = 3
    """Turns the model generates at most; its calls are answered between turns, so a
    trajectory gets ``max_turns - 1`` rounds of observations."""
    max_observation_tokens: int = 64
    """An observation longer than this many tokens is cut (its framing is kept)."""
    parallel_calls: int = 8
    """Tool calls that run at once."""
    reuse_cache: bool = True
    """Continue each turn from the last one's KV cache where the engine can
    (`HFRolloutEngine.continue_generation`): only the observations are computed before
    the next turn samples. False: every turn recomputes its whole context."""

    def __post_init__(self) -> None:
        object.__setattr__(self, "tools", tuple(self.tools))
        if self.max_turns < 1 or self.max_observation_tokens < 1 or self.parallel_calls < 1:
            raise ConfigError(f"max_turns, max_observation_tokens and parallel_calls must be "
                              f">= 1, got {self}")
        if not self.tools:
            raise ConfigError("a tool loop needs at least one tool")
        if len(set(self.tools)) != len(self.tools):
            raise ConfigError(f"tools are named twice: {list(self.tools)}")

    def registry(self) -> ToolRegistry:
        """The configured tools (built-ins by name, the others loaded from their module)."""
        builtin = default_tools(self.sandbox)
        chosen = ToolRegistry()
        for name in self.tools:
            if ":" in name:
                chosen.add(load_tool(name))
            elif name in builtin.names:
                chosen.add(builtin.get(name))
            else:
                raise ConfigError(f"unknown tool {name!r}: the built-in tools are "
                                  f"{builtin.names}; name your own as module:function")
        return chosen


@dataclass
class ToolLoopStats:
    """Counts since the loop was built."""

    trajectories: int = 0
    """Trajectories generated."""
    turns: int = 0
    """Turns generated, over every trajectory."""
    tool_calls: int = 0
    """Calls made, malformed ones included."""
    tool_errors: int = 0
    """Calls that returned an error observation."""
    tool_seconds: float = 0.0
    """Summed wall time of the calls (they overlap: this exceeds the loop's wait)."""
    per_tool: dict[str, int] = field(default_factory=dict)
    """Well-formed calls by tool name."""


@dataclass
class _Trajectory:
    prompt: tuple[int, ...]
    tokens: list[int] = field(default_factory=list)
    log_probs: list[float] = field(default_factory=list)
    tool_mask: list[bool] = field(default_factory=list)
    turns: int = 0
    calls: int = 0
    errors: int = 0
    seconds: float = 0.0
    finish_reason: FinishReason = "length"

    def extend(self, tokens: Sequence[int], log_probs: Sequence[float], *, tool: bool) -> None:
        self.tokens.extend(tokens)
        self.log_probs.extend(log_probs)
        self.tool_mask.extend([tool] * len(tokens))

    def sample(self) -> RolloutSample:
        return RolloutSample(
            prompt_token_ids=self.prompt, response_token_ids=tuple(self.tokens),
            log_probs=tuple(self.log_probs), finish_reason=self.finish_reason,
            tool_mask=tuple(self.tool_mask), turns=self.turns, tool_calls=self.calls,
            tool_errors=self.errors, tool_seconds=self.seconds)


class ToolLoop:
    """A `RolloutEngine` whose responses may call tools (see the module docstring)."""

    @classmethod
    def build(cls, engine: RolloutEngine, tokenizer: PreTrainedTokenizerBase,
              config: ToolLoopConfig) -> ToolLoop:
        """The loop `config` describes around `engine`."""
        tools = config.registry()
        return cls(engine, tokenizer, tools=tools,
                   tool_format=make_tool_format(config.format, tokenizer, tools), config=config)

    def __init__(self, engine: RolloutEngine, tokenizer: PreTrainedTokenizerBase, *,
                 tools: ToolRegistry, tool_format: ToolFormat,
                 config: ToolLoopConfig = ToolLoopConfig()) -> None:
        self.engine = engine
        self.tokenizer = tokenizer
        self.tools = tools
        self.format = tool_format
        self.config = config
        self.stats = ToolLoopStats()
        self._pool: ThreadPoolExecutor | None = None

    @property
    def model(self) -> Any:
        """The inner engine's model, when it exposes one (HF)."""
        return getattr(self.engine, "model", None)

    def generate(self, prompt_token_ids: Sequence[Sequence[int]], *,
                 sampling: SamplingConfig) -> list[RolloutSample]:
        """One trajectory per prompt; `sampling.max_new_tokens` bounds each turn."""
        runs = [_Trajectory(tuple(p)) for p in prompt_token_ids]
        active = list(range(len(runs)))
        stops = tuple(dict.fromkeys((*sampling.stop_sequences, *self.format.stop_sequences)))
        reuse = self.config.reuse_cache and callable(
            getattr(self.engine, "continue_generation", None))
        appended: dict[int, list[int]] = {}
        previous: list[int] = []
        for turn in range(self.config.max_turns):
            if not active:
                break
            seed = None if sampling.seed is None else sampling.seed + _TURN_SEED_STRIDE * turn
            call = dataclasses.replace(sampling, seed=seed, stop_sequences=stops)
            keep = reuse and turn + 1 < self.config.max_turns
            if reuse and turn:  # the last turn's contexts and cache, plus the observations
                where = {index: row for row, index in enumerate(previous)}
                samples = self.engine.continue_generation(  # type: ignore[attr-defined]
                    [where[i] for i in active], [appended[i] for i in active], sampling=call,
                    keep_cache=keep)
            elif reuse:
                samples = self.engine.generate(  # type: ignore[call-arg]
                    [runs[i].prompt for i in active], sampling=call, keep_cache=keep)
            else:
                samples = self.engine.generate([runs[i].prompt + tuple(runs[i].tokens)
                                                for i in active], sampling=call)
            previous = list(active)
            calling: list[tuple[int, Sequence[ToolCall], Sequence[str]]] = []
            for index, sample in zip(active, samples, strict=True):
                run = runs[index]
                run.extend(sample.response_token_ids, sample.log_probs, tool=False)
                run.turns += 1
                run.finish_reason = sample.finish_reason
                if sample.finish_reason == "stop_sequence" and \
                        turn + 1 < self.config.max_turns:
                    text = self.tokenizer.decode(list(sample.response_token_ids))
                    parsed = self.format.parse(str(text))
                    calling.append((index, parsed.calls, parsed.errors))
            appended = self._answer(runs, calling)
            active = [index for index, _, _ in calling]
        if reuse:
            self.engine.drop_cache()  # type: ignore[attr-defined]
        finished = [run.sample() for run in runs]
        self.stats.trajectories += len(finished)
        self.stats.turns += sum(run.turns for run in runs)
        return finished

    def _answer(self, runs: list[_Trajectory],
                calling: Sequence[tuple[int, Sequence[ToolCall], Sequence[str]]]
                ) -> dict[int, list[int]]:
        """Run every call of this round at once and append each trajectory's observations;
        returns the observation tokens appended to each."""
        appended: dict[int, list[int]] = {}
        results = self.call_tools([call for _, calls, _ in calling for call in calls])
        taken = 0
        for index, calls, errors in calling:
            run = runs[index]
            answered: list[ToolResult] = results[taken:taken + len(calls)]
            taken += len(calls)
            observations = [self._cut(r.observation) for r in answered]
            observations += [self._cut(f"[error] {message}") for message in errors]
            run.calls += len(calls) + len(errors)
            run.errors += len(errors) + sum(not r.ok for r in answered)
            run.seconds += sum(r.seconds for r in answered)
            for call in calls:
                self.stats.per_tool[call.name] = self.stats.per_tool.get(call.name, 0) + 1
            ids = self.format.observation_ids(observations)
            run.extend(ids, [0.0] * len(ids), tool=True)
            appended[index] = ids
        self.stats.tool_calls += sum(len(c) + len(e) for _, c, e in calling)
        self.stats.tool_errors += sum(len(e) for _, _, e in calling) + sum(
            not r.ok for r in results)
        self.stats.tool_seconds += sum(r.seconds for r in results)
        return appended

    def call_tools(self, calls: Sequence[ToolCall]) -> list[ToolResult]:
        """Run `calls` at once (``parallel_calls`` at a time), results in order; a call that
        fails or breaks a limit is an error result, never an exception."""
        if not calls:
            return []
        return list(self._executor().map(self.tools.call, calls))

    def _cut(self, text: str) -> str:
        """`text` cut to ``max_observation_tokens`` tokens."""
        limit = self.config.max_observation_tokens
        ids = self.tokenizer(text, add_special_tokens=False)["input_ids"]
        if len(ids) <= limit:
            return text
        return str(self.tokenizer.decode(ids[:limit])) + "...[cut]"

    def _executor(self) -> ThreadPoolExecutor:
        if self._pool is None:
            self._pool = ThreadPoolExecutor(self.config.parallel_calls,
                                            thread_name_prefix="rlinf-tool")
        return self._pool

    # -- the inner engine's weights and memory ------------------------------------------------

    def update_weights(self, named_tensors: NamedTensors) -> None:
        """Load weights into the inner engine."""
        self.engine.update_weights(named_tensors)

    def offload(self) -> None:
        """Offload the inner engine."""
        self.engine.offload()

    def onload(self) -> None:
        """Onload the inner engine."""
        self.engine.onload()

    def shutdown(self) -> None:
        """Stop the call threads and the inner engine."""
        if self._pool is not None:
            self._pool.shutdown(wait=True, cancel_futures=True)
            self._pool = None
        stop = getattr(self.engine, "shutdown", None)
        if callable(stop):
            stop()
