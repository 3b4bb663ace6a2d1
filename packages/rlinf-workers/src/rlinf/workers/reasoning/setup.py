"""What every reasoning role is built from: `RoleSetup`, and the seeding rule of the flow."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Literal

import numpy as np
from torch import nn
from transformers import PreTrainedTokenizerBase

from rlinf.workers.errors import ConfigError
from rlinf.workers.models.precision import Precision, check_precision

if TYPE_CHECKING:  # the trainer's package stays out of the roles that do not train
    from rlinf.workers.actor.lora import LoraConfig

__all__ = ["ModelFactory", "RoleSetup", "TokenizerFactory", "draw_seed"]

ModelFactory = Callable[[], tuple[nn.Module, PreTrainedTokenizerBase]]
"""Builds the initial policy and its tokenizer in the worker's process (picklable: Ray ships
it to every rank, e.g. ``functools.partial(load_warmstart, path=...)``)."""

TokenizerFactory = Callable[[], PreTrainedTokenizerBase]
"""Loads the policy's tokenizer alone, for a role that needs no model (picklable, as
`ModelFactory`)."""


@dataclass(frozen=True)
class RoleSetup:
    """Options shared by every role of one flow."""

    model_factory: ModelFactory
    """Builds the initial policy and tokenizer (every role starts from equal weights)."""
    tokenizer_factory: TokenizerFactory | None = None
    """Loads the same tokenizer without the model, for roles that only read text (the
    reward): their processes then skip building the model and importing transformers'
    modeling code, seconds of CPU each. None: `model_factory`'s tokenizer."""
    seed: int = 0
    """Root seed: every random draw of the flow derives from it (see `draw_seed`)."""
    device: Literal["cpu", "cuda"] = "cpu"
    """Where the roles compute; on CUDA each rank uses its placement device's GPU."""
    precision: Precision = "fp32"
    """Forward precision of rollout and inference ("bf16": autocast; vLLM and SGLang serve
    bfloat16 weights); the flow sets it to the actor's."""
    lock_timeout: float = 600.0
    """Seconds a role waits for its devices (collocated roles take turns)."""
    io_timeout: float = 600.0
    """Seconds a role waits for its next input on a channel."""
    lora_adapters: LoraConfig | None = None
    """The weight sync sends only these LoRA adapters (the actor's `ActorConfig.lora`), and
    every receiver merges them into its plain model (`rlinf.workers.actor.lora.AdapterTarget`)
    instead of loading the merged weights: for receivers whose base weights stay in place
    (the HF engine with ``host`` offload, the inference role). None: merged weights."""

    def __post_init__(self) -> None:
        if self.device not in ("cpu", "cuda"):
            raise ConfigError(f"device must be 'cpu' or 'cuda', got {self.device!r}")
        check_precision(self.precision)
        if self.lock_timeout <= 0 or self.io_timeout <= 0:
            raise ConfigError(f"lock_timeout and io_timeout must be > 0, got "
                              f"{self.lock_timeout} and {self.io_timeout}")

    def tokenizer(self) -> PreTrainedTokenizerBase:
        """The policy's tokenizer, without building the model where `tokenizer_factory`
        says how."""
        if self.tokenizer_factory is not None:
            return self.tokenizer_factory()
        return self.model_factory()[1]


def draw_seed(seed: int, step: int, index: int, *, purpose: int = 0) -> int:
    """Sampling seed of micro-batch `index` of iteration `step`: a pure function of its
    arguments, so a draw does not depend on which rank makes it, in what order, or after a
    resume. `purpose` separates streams (0: training rollouts; others: probes, profiling)."""
    if min(step, index, purpose) < 0:
        raise ConfigError(f"step, index and purpose must be >= 0, got {step}, {index}, "
                          f"{purpose}")
    entropy = [seed & 0xFFFFFFFF, seed >> 32 & 0xFFFFFFFF, step, index, purpose]
    state = np.random.SeedSequence(entropy).generate_state(2)
    return int(state[0]) << 31 | int(state[1]) >> 1
