"""`Batch`: the payload that rlinf.comm moves — named arrays plus small JSON metadata.

An array is a numpy ``ndarray``, a ``torch.Tensor`` (CPU or CUDA) or a cupy ``ndarray``,
of any dtype and shape. A `Batch` holds references, never copies: whoever built it still
owns the memory, and a received `Batch` holds zero-copy views whose lifetime the
transport that produced it documents.
"""

from __future__ import annotations

import json
from collections.abc import KeysView, Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any, Literal, TypeAlias

import numpy as np

from rlinf.comm.errors import CodecError

__all__ = ["Array", "ArrayKind", "Batch", "array_kind", "array_nbytes", "is_device_array"]

Array: TypeAlias = Any
"""numpy.ndarray | torch.Tensor | cupy.ndarray (typed loosely: torch and cupy are optional)."""

ArrayKind = Literal["numpy", "torch", "cupy"]



def array_kind(array: object) -> ArrayKind:
    """Which library `array` belongs to; CodecError for anything that is not an array."""
    if isinstance(array, np.ndarray):
        return "numpy"
    module = type(array).__module__.split(".", 1)[0]
    if module == "torch" and type(array).__name__ in {"Tensor", "Parameter"}:
        return "torch"
    if module == "cupy" and type(array).__name__ == "ndarray":
        return "cupy"
    # Subclasses (torch.nn.Parameter from another module path, numpy subclasses…).
    for klass in type(array).__mro__:
        mod = klass.__module__.split(".", 1)[0]
        if mod == "torch" and klass.__name__ == "Tensor":
            return "torch"
    raise CodecError(
        "expected a numpy ndarray, torch.Tensor or cupy ndarray, got "
        f"{type(array).__module__}.{type(array).__qualname__}")


def is_device_array(array: Array) -> bool:
    """True when the array lives in GPU memory (cupy, or a CUDA torch tensor)."""
    kind = array_kind(array)
    if kind == "cupy":
        return True
    if kind == "torch":
        return bool(array.is_cuda)
    return False


def array_nbytes(array: Array) -> int:
    """Bytes of the array's elements (not of the storage it may view)."""
    if array_kind(array) == "torch":
        return int(array.numel()) * int(array.element_size())
    return int(array.nbytes)


def _not_an_array(name: str, value: object) -> str:
    """What is wrong with a tensor `value` that is not an array, and where it belongs."""
    kind = f"{type(value).__module__}.{type(value).__qualname__}".removeprefix("builtins.")
    return (f"tensor {name!r} is a {kind}, not a numpy ndarray, torch.Tensor or cupy ndarray: "
            "put arrays in the tensors and small JSON-serialisable values in the metadata, "
            f"e.g. Batch({{...arrays}}, meta={{{name!r}: ...}})")


@dataclass(frozen=True, slots=True, eq=False)
class Batch:
    """Named arrays plus JSON-able metadata. Immutable container; arrays by reference.

    ``tensors`` maps names to arrays; ``meta`` holds small JSON-serialisable values
    (strings, numbers, bools, None, lists and dicts of them).
    """

    tensors: Mapping[str, Array]
    meta: Mapping[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        tensors = dict(self.tensors)
        for name, array in tensors.items():
            if not isinstance(name, str):
                raise CodecError(f"expected tensor names to be str, got {name!r}")
            if isinstance(array, np.generic):
                # numpy scalars (e.g. `arr.sum()`) are immutable: a 0-d array is the same.
                tensors[name] = np.asarray(array)
            else:
                try:
                    array_kind(array)  # validates
                except CodecError as exc:
                    raise CodecError(_not_an_array(name, array)) from exc
        meta = dict(self.meta)
        try:
            json.dumps(meta, allow_nan=False)
        except (TypeError, ValueError) as exc:
            raise CodecError(f"expected JSON-serialisable batch metadata, got {exc}") from exc
        object.__setattr__(self, "tensors", MappingProxyType(tensors))
        object.__setattr__(self, "meta", MappingProxyType(meta))

    @classmethod
    def from_trusted(cls, tensors: dict[str, Array], meta: dict[str, Any]) -> Batch:
        """A Batch of parts that came out of a valid Batch (a decoder's output), without
        validating them again (that costs a noticeable share of a small batch's round trip)."""
        batch = object.__new__(cls)
        object.__setattr__(batch, "tensors", MappingProxyType(tensors))
        object.__setattr__(batch, "meta", MappingProxyType(meta))
        return batch

    @classmethod
    def of(cls, value: Batch | Mapping[str, Array]) -> Batch:
        """Normalise a `Batch` or a plain mapping of arrays into a `Batch`."""
        if isinstance(value, Batch):
            return value
        if isinstance(value, Mapping):
            return cls(value)
        raise CodecError(f"expected a Batch or a mapping of arrays, got {type(value).__name__}")

    @property
    def nbytes(self) -> int:
        """Total bytes of all arrays' elements."""
        return sum(array_nbytes(a) for a in self.tensors.values())

    @property
    def on_device(self) -> bool:
        """True when any array lives in GPU memory."""
        return any(is_device_array(a) for a in self.tensors.values())

    def __len__(self) -> int:
        return len(self.tensors)

    def __getitem__(self, name: str) -> Array:
        return self.tensors[name]

    def __contains__(self, name: object) -> bool:
        return name in self.tensors

    def keys(self) -> KeysView[str]:
        return self.tensors.keys()

    def __repr__(self) -> str:
        parts = []
        for name, a in self.tensors.items():
            parts.append(f"{name}: {array_kind(a)} {getattr(a, 'dtype', '?')} "
                         f"{tuple(a.shape)}")
        return f"Batch({{{', '.join(parts)}}}, meta={dict(self.meta)!r})"

    def __reduce__(self) -> tuple[Any, ...]:
        # MappingProxyType does not pickle; rebuild from plain dicts.
        return (type(self), (dict(self.tensors), dict(self.meta)))
