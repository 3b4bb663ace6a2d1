"""How a group call's input is split across ranks and how their results are gathered.

verl's single-controller idea, typed: a `DispatchSpec` value (not attributes set on
functions at import time) says, per method, how the driver's arguments become per-rank
arguments and how per-rank results become one value. Driver code then reads sequentially::

    outputs = rollout.call("generate", prompts, spec=SCATTER_CONCAT)

Splitting cuts tensors and arrays along dimension 0, lists and tuples by items, and dicts
value by value (all values of one length), into nearly equal chunks: with n items over p
ranks the first ``n % p`` ranks get one more item (``torch.tensor_split``'s rule).
"""

from __future__ import annotations

import enum
import sys
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from rlinf.workers.errors import DispatchError

__all__ = [
    "ALL_TO_ALL",
    "PER_RANK_ALL",
    "RANK_ZERO",
    "SCATTER_CONCAT",
    "DispatchSpec",
    "Gather",
    "Split",
    "concat_values",
    "gather_results",
    "split_arguments",
    "split_value",
]


class Split(enum.Enum):
    """How the call's arguments reach the ranks."""

    BROADCAST = "broadcast"
    """Every target rank gets the same arguments."""
    SCATTER = "scatter"
    """Every argument is split into one chunk per target rank (see the module docstring)."""
    PER_RANK = "per_rank"
    """Every argument is a sequence with one item per target rank."""


class Gather(enum.Enum):
    """How the ranks' results come back."""

    ALL = "all"
    """A list with one result per target rank, in rank order."""
    FIRST = "first"
    """The first target rank's result (e.g. rank 0's metrics after an all-reduce)."""
    CONCAT = "concat"
    """Results concatenated: tensors/arrays along dim 0, lists/tuples, dicts per key."""
    NONE = "none"
    """None, after every rank finished (results are discarded)."""


@dataclass(frozen=True)
class DispatchSpec:
    """Split/gather rule of a group method (per call, or per method via `Worker.dispatch`)."""

    split: Split = Split.BROADCAST
    """How arguments are distributed."""
    gather: Gather = Gather.ALL
    """How results are combined."""
    ranks: tuple[int, ...] | None = None
    """Target ranks in order; None means every rank of the group."""


ALL_TO_ALL = DispatchSpec()
"""Same arguments to every rank, list of results."""
SCATTER_CONCAT = DispatchSpec(Split.SCATTER, Gather.CONCAT)
"""Data-parallel: split the batch, concatenate the outputs."""
PER_RANK_ALL = DispatchSpec(Split.PER_RANK, Gather.ALL)
"""One prepared argument per rank, list of results."""
RANK_ZERO = DispatchSpec(Split.BROADCAST, Gather.FIRST, ranks=(0,))
"""Run on rank 0 only and return its result."""


def _chunk_bounds(length: int, parts: int) -> list[tuple[int, int]]:
    base, extra = divmod(length, parts)
    bounds, start = [], 0
    for i in range(parts):
        stop = start + base + (1 if i < extra else 0)
        bounds.append((start, stop))
        start = stop
    return bounds


def _torch_tensor_type() -> Any:
    # A tensor can only exist if torch was imported; do not import it just to check.
    torch = sys.modules.get("torch")
    return None if torch is None else torch.Tensor


def _length(value: Any) -> int:
    tensor_type = _torch_tensor_type()
    if tensor_type is not None and isinstance(value, tensor_type):
        if value.ndim == 0:
            raise DispatchError("cannot split a 0-d tensor; broadcast it instead")
        return int(value.shape[0])
    if isinstance(value, np.ndarray):
        if value.ndim == 0:
            raise DispatchError("cannot split a 0-d array; broadcast it instead")
        return int(value.shape[0])
    if isinstance(value, list | tuple):
        return len(value)
    if isinstance(value, Mapping):
        lengths = {key: _length(item) for key, item in value.items()}
        if len(set(lengths.values())) > 1:
            raise DispatchError(f"cannot split a dict whose values differ in length: {lengths}")
        if not lengths:
            raise DispatchError("cannot split an empty dict")
        return next(iter(lengths.values()))
    raise DispatchError(
        f"cannot split a value of type {type(value).__name__}: expected a torch tensor, numpy "
        "array, list, tuple or dict of them; broadcast it or use a per-call spec instead"
    )


def split_value(value: Any, parts: int) -> list[Any]:
    """Split `value` into `parts` nearly equal chunks along its first dimension."""
    if parts < 1:
        raise DispatchError(f"cannot split into {parts} parts: expected >= 1")
    bounds = _chunk_bounds(_length(value), parts)
    if isinstance(value, Mapping):
        per_key = {key: split_value(item, parts) for key, item in value.items()}
        return [{key: chunks[i] for key, chunks in per_key.items()} for i in range(parts)]
    return [value[start:stop] for start, stop in bounds]


def concat_values(values: Sequence[Any]) -> Any:
    """Inverse of `split_value`: concatenate chunks of one kind in order."""
    if not values:
        raise DispatchError("nothing to concatenate: no results")
    first = values[0]
    tensor_type = _torch_tensor_type()
    if tensor_type is not None and isinstance(first, tensor_type):
        import torch

        return torch.cat(list(values), dim=0)
    if isinstance(first, np.ndarray):
        return np.concatenate(list(values), axis=0)
    if isinstance(first, list):
        return [item for value in values for item in value]
    if isinstance(first, tuple):
        return tuple(item for value in values for item in value)
    if isinstance(first, Mapping):
        keys = list(first)
        if any(list(value) != keys for value in values):
            raise DispatchError("cannot concatenate dicts with different keys")
        return {key: concat_values([value[key] for value in values]) for key in keys}
    if all(value is None for value in values):
        return None
    raise DispatchError(
        f"cannot concatenate results of type {type(first).__name__}: expected tensors, "
        "arrays, lists, tuples or dicts of them; gather with Gather.ALL instead"
    )


def split_arguments(
    spec: DispatchSpec, args: tuple[Any, ...], kwargs: Mapping[str, Any], parts: int
) -> list[tuple[tuple[Any, ...], dict[str, Any]]]:
    """Per-target-rank ``(args, kwargs)`` for a call with `spec` over `parts` ranks."""
    if spec.split is Split.BROADCAST:
        return [(args, dict(kwargs)) for _ in range(parts)]
    if spec.split is Split.SCATTER:
        arg_chunks = [split_value(arg, parts) for arg in args]
        kw_chunks = {key: split_value(value, parts) for key, value in kwargs.items()}
    else:
        for name, value in [*((f"argument {i}", a) for i, a in enumerate(args)),
                            *kwargs.items()]:
            if not isinstance(value, Sequence) or len(value) != parts:
                raise DispatchError(
                    f"Split.PER_RANK needs {name} to be a sequence of {parts} items (one per "
                    f"target rank), got {type(value).__name__}"
                    + (f" of length {len(value)}" if isinstance(value, Sequence) else "")
                )
        arg_chunks = [list(arg) for arg in args]
        kw_chunks = {key: list(value) for key, value in kwargs.items()}
    return [
        (tuple(chunks[i] for chunks in arg_chunks),
         {key: chunks[i] for key, chunks in kw_chunks.items()})
        for i in range(parts)
    ]


def gather_results(spec: DispatchSpec, results: Sequence[Any]) -> Any:
    """Combine per-target-rank `results` (in target order) by `spec.gather`."""
    if spec.gather is Gather.ALL:
        return list(results)
    if spec.gather is Gather.FIRST:
        return results[0] if results else None
    if spec.gather is Gather.CONCAT:
        return concat_values(results)
    return None
