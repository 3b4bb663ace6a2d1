"""LoRA adapters on the policy with PEFT: only the adapters train, and only they have
optimizer state.

`apply_lora` wraps a Hugging Face causal LM in a ``peft.PeftModel`` whose base weights are
frozen. Generators keep the plain model, so the weight sync sends them the merged weights
(`merged_named_tensors`: ``W + scale * B @ A`` under the base model's names, computed
without touching the trainer's model), or only the adapters (`adapter_named_tensors`,
PEFT's own names and layout) to a receiver that merges them itself (`LoraMerger`).
Checkpoints hold the whole PEFT model; an export writes the adapter in PEFT's layout or the
merged model.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any, Protocol

import torch
from torch import nn

from rlinf.workers._extras import require
from rlinf.workers.errors import ConfigError

__all__ = ["ADAPTER", "AdapterTarget", "LoraConfig", "LoraMerger", "adapter_named_tensors",
           "apply_lora", "is_adapter_name", "is_lora_model", "merged_named_tensors",
           "trainable_parameter_count"]

ADAPTER = "default"
"""PEFT's name of the one adapter the policy trains."""


@dataclass(frozen=True)
class LoraConfig:
    """Low-rank adapters on the policy's linear layers."""

    rank: int = 8
    """Rank r of each adapter (``B @ A`` with A of r x in, B of out x r)."""
    alpha: float = 16.0
    """Scale numerator: the update is ``alpha / rank * B @ A``."""
    target_modules: tuple[str, ...] = ("q_proj", "k_proj", "v_proj", "o_proj")
    """Names (last parts) of the linear layers that get adapters."""
    dropout: float = 0.0
    """Dropout on the adapters' input while training."""

    def __post_init__(self) -> None:
        if self.rank < 1:
            raise ConfigError(f"lora rank must be >= 1, got {self.rank}")
        if not self.alpha > 0:
            raise ConfigError(f"lora alpha must be > 0, got {self.alpha}")
        if not 0.0 <= self.dropout < 1.0:
            raise ConfigError(f"lora dropout must be in [0, 1), got {self.dropout}")
        if not self.target_modules:
            raise ConfigError("lora target_modules must name at least one linear layer")

    def to_peft(self) -> Any:
        """The ``peft.LoraConfig`` of these settings."""
        peft = require("peft", feature="LoRA adapters (actor.lora)", extra="lora")
        return peft.LoraConfig(r=self.rank, lora_alpha=self.alpha,
                               target_modules=list(self.target_modules),
                               lora_dropout=self.dropout, bias="none")


def apply_lora(model: nn.Module, config: LoraConfig) -> nn.Module:
    """`model` wrapped with adapters (a ``peft.PeftModel``); ConfigError naming the model's
    linear layers when `config.target_modules` matches none of them."""
    peft = require("peft", feature="LoRA adapters (actor.lora)", extra="lora")
    linear = sorted({name.rsplit(".", 1)[-1] for name, module in model.named_modules()
                     if isinstance(module, nn.Linear)})
    missing = [t for t in config.target_modules if t not in linear]
    if missing:
        raise ConfigError(f"lora target_modules {list(missing)} name no linear layer of this "
                          f"{type(model).__name__}; its linear layers are {linear}")
    return peft.get_peft_model(model, config.to_peft())


def is_lora_model(model: nn.Module) -> bool:
    """Whether `model` is a PEFT model with adapters."""
    return hasattr(model, "peft_config") and hasattr(model, "get_base_model")


def trainable_parameter_count(model: nn.Module) -> int:
    """Elements of the parameters that train."""
    return sum(p.numel() for p in model.parameters() if p.requires_grad)


def _lora_layers(model: nn.Module) -> Iterable[tuple[str, nn.Module]]:
    """``(name under the base model, layer)`` of every layer carrying an adapter."""
    for name, module in model.get_base_model().named_modules():  # type: ignore[operator]
        if hasattr(module, "base_layer") and hasattr(module, "get_delta_weight") and \
                ADAPTER in getattr(module, "lora_A", {}):
            yield name, module


def merged_named_tensors(model: nn.Module) -> list[tuple[str, torch.Tensor]]:
    """The base model's ``(name, tensor)`` state with every adapter merged in, as a plain
    model of the base architecture names them; `model` itself is left unmerged."""
    deltas = {f"{name}.weight": module.get_delta_weight(ADAPTER)  # type: ignore[operator]
              for name, module in _lora_layers(model)}
    out = []
    for name, tensor in model.get_base_model().state_dict().items():  # type: ignore[operator]
        if ".lora_" in name:
            continue
        plain = name.replace(".base_layer.", ".")
        value = tensor.detach()
        if plain in deltas:
            value = value + deltas[plain].to(value.dtype)
        out.append((plain, value))
    return out


def adapter_named_tensors(model: nn.Module) -> list[tuple[str, torch.Tensor]]:
    """The adapters' ``(name, tensor)`` in PEFT's saved layout (what ``save_pretrained``
    writes to ``adapter_model.safetensors``)."""
    peft = require("peft", feature="LoRA adapters (actor.lora)", extra="lora")
    state = peft.get_peft_model_state_dict(model, adapter_name=ADAPTER)
    return [(name, tensor.detach()) for name, tensor in state.items()]


class LoraMerger:
    """A generator's side of an adapters-only sync: it keeps the base weights of the adapted
    layers and, given new adapters, writes ``base + alpha / rank * B @ A`` into its plain
    model."""

    def __init__(self, model: nn.Module, config: LoraConfig) -> None:
        self.model = model
        self.scale = config.alpha / config.rank
        targets = set(config.target_modules)
        self.base = {f"{name}.weight": module.weight.detach().clone()
                     for name, module in model.named_modules()
                     if isinstance(module, nn.Linear) and name.rsplit(".", 1)[-1] in targets}

    def load(self, adapters: Mapping[str, torch.Tensor]) -> int:
        """Merge PEFT-named adapters (`adapter_named_tensors`) into the model; returns the
        layers updated. ConfigError for an adapter of a layer this model lacks."""
        pairs: dict[str, dict[str, torch.Tensor]] = {}
        for name, tensor in adapters.items():
            for part in ("lora_A", "lora_B"):
                if f".{part}." in name:
                    layer = name.split(f".{part}.")[0].removeprefix("base_model.model.")
                    pairs.setdefault(f"{layer}.weight", {})[part] = tensor
        params = dict(self.model.named_parameters())
        with torch.no_grad():
            for weight, pair in pairs.items():
                if weight not in self.base or len(pair) != 2:
                    raise ConfigError(f"adapter for {weight!r} does not match a target layer "
                                      f"of this model (or lacks lora_A/lora_B)")
                base = self.base[weight]
                delta = (pair["lora_B"].float() @ pair["lora_A"].float()) * self.scale
                params[weight].copy_((base.float() + delta.to(base.device)).to(base.dtype))
        return len(pairs)


def is_adapter_name(name: str) -> bool:
    """Whether `name` is an adapter tensor's (PEFT's ``lora_A`` / ``lora_B``)."""
    return ".lora_A." in name or ".lora_B." in name


class _Target(Protocol):
    def update_weights(self, named_tensors: list[tuple[str, torch.Tensor]]) -> None: ...


class AdapterTarget:
    """A receiver's weight target in an adapters-only sync: adapter tensors go to a
    `LoraMerger` over the receiver's plain model (an adapter whose ``lora_A`` and
    ``lora_B`` arrive in different buckets waits, copied, for its other half), any other
    tensor to `target`."""

    def __init__(self, target: _Target, merger: LoraMerger) -> None:
        self.target = target
        self.merger = merger
        self._waiting: dict[str, torch.Tensor] = {}

    def update_weights(self, named_tensors: list[tuple[str, torch.Tensor]]) -> None:
        """Merge the adapters among `named_tensors` (a bucket); load the rest into the
        target."""
        plain = []
        for name, tensor in named_tensors:
            if is_adapter_name(name):
                # Copied: a bucket's buffers are released once the call returns.
                self._waiting[name] = tensor.detach().clone()
            else:
                plain.append((name, tensor))
        if plain:
            self.target.update_weights(plain)
        layers: dict[str, list[str]] = {}
        for name in self._waiting:
            layers.setdefault(name.replace(".lora_A.", ".lora_?.").replace(
                ".lora_B.", ".lora_?."), []).append(name)
        ready = {n: self._waiting.pop(n) for names in layers.values() if len(names) == 2
                 for n in names}
        if ready:
            self.merger.load(ready)
