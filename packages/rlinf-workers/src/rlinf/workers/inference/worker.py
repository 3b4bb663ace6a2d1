"""`LogProbEngine`: per-token log-probs of generated responses under a given model.

Two roles in the reasoning flow: the *actor* role recomputes the generating policy's
log-probs (``old_log_probs``, the denominator of the PPO ratio; recomputing them instead of
trusting the rollout engine's keeps the ratio exact when the engine's numerics differ), and
the *reference* role scores responses under the frozen initial model (``ref_log_probs``,
for the KL penalty). Both use `rlinf.workers.models.response_log_probs`, micro-batched,
with the attention kernel the actor trains with (`InferenceConfig.attention`): in bf16 two
kernels differ by ~1e-3 in a log-prob, the same one gives the trainer's bits.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

import structlog
import torch
from torch import nn

from rlinf.workers.errors import ConfigError
from rlinf.workers.models import Precision, check_precision, compute_precision, response_log_probs
from rlinf.workers.models.attention import (
    AttentionChoice,
    attention_kernel,
    check_attention,
    training_attention,
)
from rlinf.workers.rollout.batch import RolloutBatch
from rlinf.workers.rollout.offload import empty_device_cache, move_module
from rlinf.workers.rollout.types import NamedTensors

__all__ = ["InferenceConfig", "InferenceRole", "LogProbEngine"]

InferenceRole = Literal["actor", "reference"]

_log = structlog.get_logger(__name__)


@dataclass(frozen=True)
class InferenceConfig:
    """How log-probs are recomputed."""

    role: InferenceRole = "actor"
    """"actor" fills ``old_log_probs``, "reference" fills ``ref_log_probs``."""
    micro_batch_size: int = 16
    """Rows per forward pass (bounds peak activation memory)."""
    temperature: float = 1.0
    """Sampling temperature of the rollout (log-probs are of the scaled distribution)."""
    precision: Precision = "fp32"
    """Forward precision: "fp32" or "bf16" autocast (as the actor trains)."""
    padding_free: bool = True
    """Score the real tokens only, packed end to end (`ActorConfig.padding_free`)."""
    attention: AttentionChoice = "auto"
    """Attention kernel, chosen as the actor's (`ActorConfig.attention`, whose choice this
    must be for the old log-probs to be the trainer's numbers)."""

    def __post_init__(self) -> None:
        if self.role not in ("actor", "reference"):
            raise ConfigError(f"role must be 'actor' or 'reference', got {self.role!r}")
        if self.micro_batch_size < 1 or self.temperature <= 0:
            raise ConfigError(f"micro_batch_size must be >= 1 and temperature > 0, got "
                              f"{self.micro_batch_size} and {self.temperature}")
        check_precision(self.precision)
        check_attention(self.attention)


class LogProbEngine:
    """Scores responses under `model` (see the module docstring)."""

    def __init__(
        self, model: nn.Module, *, config: InferenceConfig = InferenceConfig(),
        device: torch.device | str | None = None,
    ) -> None:
        self.model = model
        self.config = config
        self.device = torch.device(device) if device is not None else next(
            model.parameters()).device
        move_module(model, self.device)
        model.eval()
        self._targets = dict(model.state_dict(keep_vars=True))

    def compute_log_probs(self, batch: RolloutBatch) -> torch.Tensor:
        """``[B, R]`` float32 log-probs of `batch`'s responses (0 on padding), on CPU."""
        kernel = training_attention(self.config.attention, precision=self.config.precision,
                                    device=self.device)
        with torch.no_grad(), compute_precision(self.config.precision, self.device), \
                attention_kernel(self.model, kernel):
            log_probs = response_log_probs(
                self.model,
                prompt_ids=batch.prompt_ids.to(self.device),
                prompt_mask=batch.prompt_mask.to(self.device),
                response_ids=batch.response_ids.to(self.device),
                response_mask=batch.response_mask.to(self.device),
                temperature=self.config.temperature,
                micro_batch_size=self.config.micro_batch_size,
                padding_free=self.config.padding_free,
            )
        return log_probs.float().cpu()

    def annotate(self, batch: RolloutBatch) -> RolloutBatch:
        """`batch` with ``old_log_probs`` (actor role) or ``ref_log_probs`` (reference) set."""
        log_probs = self.compute_log_probs(batch)
        if self.config.role == "actor":
            return batch.replace(old_log_probs=log_probs)
        return batch.replace(ref_log_probs=log_probs)

    def update_weights(self, named_tensors: NamedTensors) -> None:
        """Load new parameters by name (the actor-role worker follows the trainer)."""
        with torch.no_grad():
            for name, tensor in named_tensors:
                if name not in self._targets:
                    raise ConfigError(f"unknown parameter {name!r}")
                self._targets[name].copy_(tensor)

    def offload(self) -> None:
        """Move the model to host memory and return cached device blocks."""
        move_module(self.model, "cpu")
        empty_device_cache(self.device)

    def onload(self) -> None:
        """Move the model back to its device."""
        move_module(self.model, self.device)
