"""Every model-parallel rank's state dict onto one rank, as tensors: what the weight sync
and the export reassemble into Hugging Face layout (`convert.shards_to_hf`).

Only the names, shapes and dtypes cross as Python objects (small); the tensors cross with
point-to-point sends, each in slices of at most `chunk_bytes`, so nothing is pickled and
the receiving device holds one slice at a time. What is received lands on the host, where
the whole model is assembled. Measured on two gloo ranks (127M parameters, TP=2), this
replaced a ``gather_object`` of the pickled shards.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import torch
import torch.distributed as dist

__all__ = ["gather_shards"]

Place = tuple[int, int]
"""(pipeline stage, tensor rank) of a shard."""


def gather_shards(local: Mapping[str, torch.Tensor], place: Place, *, group: Any,
                  root: int, device: torch.device, chunk_bytes: int = 64 << 20
                  ) -> list[tuple[int, int, dict[str, torch.Tensor]]] | None:
    """On global rank `root`: every rank of `group`'s ``(stage, tensor rank, state dict)``
    on the host, in group order; None on the others. A collective over `group`: every rank
    calls it, with its own `local` tensors on `device`."""
    layout = [(name, tuple(t.shape), t.dtype) for name, t in local.items()]
    rank = dist.get_rank()
    layouts: list[Any] | None = [None] * dist.get_world_size(group) if rank == root else None
    dist.gather_object((place, layout), layouts, dst=root, group=group)
    if layouts is None:
        for tensor in local.values():
            for piece in _slices(tensor.detach().contiguous().reshape(-1), chunk_bytes):
                dist.send(piece, dst=root, group=group)
        return None
    shards = []
    staging: dict[torch.dtype, torch.Tensor] = {}
    for index, (peer_place, peer_layout) in enumerate(layouts):
        peer = dist.get_global_rank(group, index)
        if peer == root:
            state = {name: t.detach().cpu() for name, t in local.items()}
        else:
            state = {name: _receive(shape, dtype, peer, group=group, device=device,
                                    chunk_bytes=chunk_bytes, staging=staging)
                     for name, shape, dtype in peer_layout}
        shards.append((int(peer_place[0]), int(peer_place[1]), state))
    return shards


def _slices(flat: torch.Tensor, chunk_bytes: int) -> list[torch.Tensor]:
    step = max(1, chunk_bytes // max(flat.element_size(), 1))
    return [flat[start: start + step] for start in range(0, flat.numel(), step)] or [flat]


def _receive(shape: tuple[int, ...], dtype: torch.dtype, peer: int, *, group: Any,
             device: torch.device, chunk_bytes: int,
             staging: dict[torch.dtype, torch.Tensor]) -> torch.Tensor:
    """One tensor from `peer`, slice by slice, into host memory (through a reused staging
    slice on `device` when that is not the host: NCCL receives into device memory only)."""
    out = torch.empty(shape, dtype=dtype)
    for piece in _slices(out.reshape(-1), chunk_bytes):
        if device.type == "cpu":
            dist.recv(piece, src=peer, group=group)
            continue
        buffer = staging.get(dtype)
        if buffer is None or buffer.numel() < piece.numel():
            buffer = staging[dtype] = torch.empty(
                max(piece.numel(), chunk_bytes // piece.element_size()), dtype=dtype,
                device=device)
        view = buffer[: piece.numel()]
        dist.recv(view, src=peer, group=group)
        piece.copy_(view)
    return out
