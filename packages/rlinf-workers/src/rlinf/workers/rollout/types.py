"""What every rollout engine speaks: sampling options, one generated sample, the protocol.

Token ids in, token ids out: prompts arrive tokenized and responses leave as ids plus the
log-prob of each sampled token, so the engines (HF, vLLM, SGLang) are interchangeable and
the trainer never re-tokenizes text.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Literal, Protocol, runtime_checkable

import torch

from rlinf.workers.errors import ConfigError, WorkersError

__all__ = [
    "FinishReason",
    "NamedTensors",
    "RolloutEngine",
    "RolloutError",
    "RolloutSample",
    "SamplingConfig",
    "ends_with_stop_sequence",
]

FinishReason = Literal["stop", "length", "stop_sequence"]
"""``stop``: the response ended with EOS; ``length``: it was cut at ``max_new_tokens``;
``stop_sequence``: it ended with one of `SamplingConfig.stop_sequences` (a tool call's
closing tag), which it includes."""

NamedTensors = Iterable[tuple[str, torch.Tensor]]
"""Parameters as ``(name, tensor)`` pairs, named as in the trainer's ``state_dict``."""


class RolloutError(WorkersError, RuntimeError):
    """A rollout engine cannot serve the call (weights not loaded, engine shut down, ...)."""


@dataclass(frozen=True)
class SamplingConfig:
    """How responses are sampled."""

    max_new_tokens: int = 16
    """Longest response, in tokens (EOS included)."""
    temperature: float = 1.0
    """Softmax temperature; 0 means greedy decoding."""
    top_p: float = 1.0
    """Nucleus sampling: keep the smallest token set with this much probability (1 = off)."""
    top_k: int = 0
    """Keep only the k most likely tokens (0 = off)."""
    seed: int | None = None
    """Seed of the sampling RNG for reproducible rollouts; None draws a fresh one."""
    stop_sequences: tuple[tuple[int, ...], ...] = ()
    """Token-id sequences that end a response besides EOS, kept in it (a multi-turn rollout
    stops at a tool call's closing tag this way)."""

    def __post_init__(self) -> None:
        object.__setattr__(self, "stop_sequences",
                           tuple(tuple(int(t) for t in seq) for seq in self.stop_sequences))
        if any(not seq for seq in self.stop_sequences):
            raise ConfigError("every stop sequence needs at least one token")
        if self.max_new_tokens < 1:
            raise ConfigError(f"max_new_tokens must be >= 1, got {self.max_new_tokens}")
        if self.temperature < 0:
            raise ConfigError(f"temperature must be >= 0, got {self.temperature}")
        if not 0.0 < self.top_p <= 1.0:
            raise ConfigError(f"top_p must be in (0, 1], got {self.top_p}")
        if self.top_k < 0:
            raise ConfigError(f"top_k must be >= 0 (0 = off), got {self.top_k}")

    @property
    def greedy(self) -> bool:
        """True when decoding takes the argmax instead of sampling."""
        return self.temperature == 0.0

    @property
    def logprob_temperature(self) -> float:
        """Temperature the reported log-probs are computed at (1 for greedy decoding)."""
        return 1.0 if self.greedy else self.temperature


@dataclass(frozen=True)
class RolloutSample:
    """One generated response to one prompt."""

    prompt_token_ids: tuple[int, ...]
    """The prompt, as given."""
    response_token_ids: tuple[int, ...]
    """Generated tokens, EOS included when the response stopped on it."""
    log_probs: tuple[float, ...]
    """Log-prob of each response token under the temperature-scaled full distribution
    (the one `rlinf.workers.models.response_log_probs` computes), one per token."""
    finish_reason: FinishReason
    """Why generation ended (a multi-turn response: why its last turn ended)."""
    tool_mask: tuple[bool, ...] = ()
    """A multi-turn response: True on each token a tool wrote (its observations, which the
    loss and the KL leave out; their log-probs are 0). Empty: the model wrote every token."""
    turns: int = 1
    """Turns the model generated."""
    tool_calls: int = 0
    """Tool calls the model made."""
    tool_errors: int = 0
    """Calls that returned an error observation (a malformed call, a broken limit)."""
    tool_seconds: float = 0.0
    """Wall time spent in this response's tool calls."""

    def __post_init__(self) -> None:
        if len(self.log_probs) != len(self.response_token_ids):
            raise ConfigError(
                f"expected one log-prob per response token, got {len(self.log_probs)} for "
                f"{len(self.response_token_ids)} tokens"
            )
        if self.tool_mask and len(self.tool_mask) != len(self.response_token_ids):
            raise ConfigError(f"tool_mask has {len(self.tool_mask)} entries for "
                              f"{len(self.response_token_ids)} response tokens")


def ends_with_stop_sequence(tokens: Sequence[int],
                            stop_sequences: Sequence[Sequence[int]]) -> bool:
    """Whether `tokens` end with one of `stop_sequences`."""
    return any(len(tokens) >= len(seq) and tuple(tokens[len(tokens) - len(seq):]) == tuple(seq)
               for seq in stop_sequences)


@runtime_checkable
class RolloutEngine(Protocol):
    """A generation backend; implementations: HF `generate`, vLLM, SGLang."""

    def generate(
        self, prompt_token_ids: Sequence[Sequence[int]], *, sampling: SamplingConfig
    ) -> list[RolloutSample]:
        """One sample per prompt, in prompt order."""
        ...

    def update_weights(self, named_tensors: NamedTensors) -> None:
        """Load new parameters (all or a bucket of them) into the engine's model."""
        ...

    def offload(self) -> None:
        """Free the engine's device memory (weights, KV cache)."""
        ...

    def onload(self) -> None:
        """Bring the engine back after `offload`."""
        ...
