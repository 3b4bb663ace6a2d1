"""Wrap the actor's modules for data parallelism: DDP, or FSDP2's `fully_shard`."""

from __future__ import annotations

import torch
import torch.distributed as dist
from torch import nn

from rlinf.workers.actor.config import Parallelism

__all__ = ["full_named_tensors", "is_distributed", "unwrap", "wrap"]


def is_distributed() -> bool:
    """True when a default process group with more than one rank is initialised."""
    return dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1


def wrap(module: nn.Module, *, parallelism: Parallelism, device: torch.device) -> nn.Module:
    """The module to call for training: DDP-wrapped, FSDP2-sharded in place, or itself."""
    if not is_distributed() or parallelism == "none":
        return module
    if parallelism == "ddp":
        from torch.nn.parallel import DistributedDataParallel

        ids = [device.index] if device.type == "cuda" else None
        return DistributedDataParallel(module, device_ids=ids)
    from torch.distributed.fsdp import fully_shard

    # Shard each decoder layer as its own unit (gathered just in time), then the root
    # (embeddings, final norm, head), the layout FSDP2's docs recommend for transformers.
    for layer in _decoder_layers(module):
        fully_shard(layer)
    fully_shard(module)
    return module


def unwrap(module: nn.Module) -> nn.Module:
    """The underlying model (DDP keeps it in ``.module``; FSDP2 shards in place)."""
    from torch.nn.parallel import DistributedDataParallel

    return module.module if isinstance(module, DistributedDataParallel) else module


def full_named_tensors(module: nn.Module) -> list[tuple[str, torch.Tensor]]:
    """``(name, full tensor)`` of the model's state dict, gathering FSDP2 shards (collective:
    every rank must call it)."""
    out = []
    for name, tensor in unwrap(module).state_dict().items():
        full = tensor.full_tensor() if hasattr(tensor, "full_tensor") else tensor
        out.append((name, full.detach()))
    return out


def _decoder_layers(module: nn.Module) -> list[nn.Module]:
    for path in ("model.layers", "trunk.model.layers"):
        node: object = module
        for part in path.split("."):
            node = getattr(node, part, None)
        if isinstance(node, nn.ModuleList):
            return list(node)
    return []
