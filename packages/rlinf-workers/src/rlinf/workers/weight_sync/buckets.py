"""Group named tensors into size-bounded buckets: fewer, larger transfers for weight sync.

A bucket is a list of ``(name, tensor)`` pairs whose byte sizes add up to at most
``bucket_bytes`` — except a single tensor larger than that, which travels alone.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator

import torch

from rlinf.workers.errors import ConfigError

__all__ = ["Bucket", "iter_buckets", "tensor_bytes"]

Bucket = list[tuple[str, torch.Tensor]]


def tensor_bytes(tensor: torch.Tensor) -> int:
    """Bytes of the tensor's elements."""
    return tensor.numel() * tensor.element_size()


def iter_buckets(
    named: Iterable[tuple[str, torch.Tensor]], *, bucket_bytes: int
) -> Iterator[Bucket]:
    """Consecutive buckets of `named`, in order, each at most `bucket_bytes` (see module doc)."""
    if bucket_bytes < 1:
        raise ConfigError(f"bucket_bytes must be >= 1, got {bucket_bytes}")
    bucket: Bucket = []
    size = 0
    for name, tensor in named:
        nbytes = tensor_bytes(tensor)
        if bucket and size + nbytes > bucket_bytes:
            yield bucket
            bucket, size = [], 0
        bucket.append((name, tensor))
        size += nbytes
    if bucket:
        yield bucket
