"""Pack a bucket of tensors into one flat byte buffer and unpack it as views.

One contiguous buffer per bucket means one transfer (one shared-memory copy, one CUDA IPC
handle, one NCCL broadcast) however many tensors the bucket holds. Offsets are aligned to
`ALIGN` bytes so every view is aligned for its dtype.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from rlinf.workers.errors import ShapeError
from rlinf.workers.weight_sync.buckets import Bucket, tensor_bytes

__all__ = ["ALIGN", "TensorMeta", "flatten_bucket", "plan_layout", "unflatten_bucket"]

ALIGN = 64


@dataclass(frozen=True)
class TensorMeta:
    """Where one tensor lives inside a flat bucket buffer (picklable, no data)."""

    name: str
    """Parameter name."""
    dtype: str
    """torch dtype name, e.g. "float32"."""
    shape: tuple[int, ...]
    """Tensor shape."""
    offset: int
    """Byte offset in the buffer (a multiple of `ALIGN`)."""


def _dtype(name: str) -> torch.dtype:
    dtype = getattr(torch, name, None)
    if not isinstance(dtype, torch.dtype):
        raise ShapeError(f"unknown torch dtype {name!r}")
    return dtype


def plan_layout(bucket: Bucket) -> tuple[list[TensorMeta], int]:
    """Metadata of each tensor and the total buffer size, without copying anything."""
    metas, offset = [], 0
    for name, tensor in bucket:
        metas.append(TensorMeta(name=name, dtype=str(tensor.dtype).removeprefix("torch."),
                                shape=tuple(tensor.shape), offset=offset))
        offset += -(-tensor_bytes(tensor) // ALIGN) * ALIGN
    return metas, offset


def flatten_bucket(
    bucket: Bucket, *, out: torch.Tensor | None = None, device: torch.device | str | None = None
) -> tuple[torch.Tensor, list[TensorMeta]]:
    """Copy the bucket into a uint8 buffer (`out` if given, else new on `device` or the
    tensors' device); returns the buffer and the layout."""
    metas, size = plan_layout(bucket)
    if out is None:
        where = device if device is not None else (bucket[0][1].device if bucket else "cpu")
        out = torch.empty(size, dtype=torch.uint8, device=where)
    elif out.dtype != torch.uint8 or out.numel() < size:
        raise ShapeError(f"out must be a uint8 buffer of >= {size} bytes, got {out.dtype} "
                         f"x {out.numel()}")
    for meta, (_, tensor) in zip(metas, bucket, strict=True):
        flat = tensor.detach().contiguous().reshape(-1).view(torch.uint8)
        out[meta.offset:meta.offset + flat.numel()].copy_(flat, non_blocking=True)
    return out, metas


def unflatten_bucket(buffer: torch.Tensor, metas: list[TensorMeta]) -> Bucket:
    """Views into `buffer` (no copies) named and shaped per `metas`."""
    out: Bucket = []
    for meta in metas:
        dtype = _dtype(meta.dtype)
        numel = 1
        for dim in meta.shape:
            numel *= dim
        nbytes = numel * torch.empty((), dtype=dtype).element_size()
        raw = buffer[meta.offset:meta.offset + nbytes]
        out.append((meta.name, raw.view(dtype).view(meta.shape)))
    return out
