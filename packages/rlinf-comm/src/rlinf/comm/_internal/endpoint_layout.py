"""Payload layouts the endpoint uses besides the transports' Arrow encoding.

- *inline*: a small batch of plain numpy arrays travels as raw bytes in the frame, described
  by dtype/shape in the JSON header (the eager protocol of `Endpoint.send`);
- *raw*: plain numpy batches in a shared-memory segment at 64-byte aligned offsets, described
  in the descriptor (channel items; small ones share arena segments).

Both give the receiver zero-copy numpy views, like the codec, at a fraction of its per-item
cost, which dominates small messages. Anything else (torch, GPU, dtypes numpy cannot
round-trip through `dtype.str`) goes through the transports.
"""

from __future__ import annotations

import math
import os
import threading
from collections.abc import Callable, Mapping
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import numpy as np
import pyarrow as pa

from rlinf.comm import errors
from rlinf.comm._internal import codec, shm
from rlinf.comm._internal import transports as tp
from rlinf.comm._internal.rpc import Buffers, Header
from rlinf.comm.batch import Batch


def align(nbytes: int) -> int:
    """Arena slots start 64-byte aligned (Arrow's preferred alignment)."""
    return (nbytes + 63) & ~63


# -- eager protocol for small host batches ----------------------------------------------
# A small batch of plain numpy arrays travels as raw array bytes in the frame, described by
# dtype and shape in the JSON header: no Arrow encoding on either side (which costs far more
# than the bytes for a few KiB). Anything else (torch, GPU, exotic dtypes) uses transports.
INLINE = "inline"


def inline_ok(batch: Batch, limit: int, src: tp.Locality, dst: tp.Locality) -> bool:
    return not src.same_process(dst) and inline_eligible(batch, limit)


def inline_eligible(batch: Batch, limit: int) -> bool:
    """Whether `batch` may travel inline: plain numpy arrays of at most `limit` bytes."""
    nbytes = 0
    for array in batch.tensors.values():
        if type(array) is not np.ndarray or array.dtype.hasobject:
            return False
        if np.dtype(array.dtype.str) != array.dtype:  # structured, or not round-trippable
            return False
        nbytes += array.nbytes
    return nbytes <= limit


def inline_parts(batch: Batch) -> tuple[Header, list[Any]]:
    """The descriptor (dtype, shape per array, and the metadata) and the raw buffers, one per
    array, of an inline payload; the buffers view the caller's arrays (copied if strided)."""
    specs, buffers = [], []
    for name, array in batch.tensors.items():
        # (`np.ascontiguousarray` would make a 0-d array 1-d: the shape is the array's own)
        contiguous = array if array.flags.c_contiguous else np.ascontiguousarray(array)
        specs.append([name, array.dtype.str, list(array.shape)])
        buffers.append(contiguous.reshape(-1).view(np.uint8))
    return {"tensors": specs, "meta": dict(batch.meta)}, buffers


_PLAIN: dict[np.dtype[Any], tuple[str, bool]] = {}
"""dtype -> (its `dtype.str`, whether numpy hands out its buffer as is), for the plain
dtypes that round-trip through `dtype.str`."""


def inline_item(item: Any, limit: int) -> tuple[Header, list[Any]] | None:
    """`inline_parts` of a small item in one pass, checking what `Batch` would (str names,
    numpy arrays), or None when it is not a mapping of C-contiguous plain numpy arrays of
    at most `limit` bytes in all (`inline_eligible` then decides on the `Batch`)."""
    tensors: Mapping[str, Any]
    meta: Mapping[str, Any] | None
    if type(item) is dict:
        tensors, meta = item, None
    elif isinstance(item, Batch):
        tensors, meta = item.tensors, item.meta
    else:
        return None
    specs, buffers, total = [], [], 0
    for name, array in tensors.items():
        if type(array) is not np.ndarray or type(name) is not str:
            return None
        if not array.flags.c_contiguous:
            return None
        plain = _PLAIN.get(array.dtype)
        if plain is None:
            dtype = array.dtype
            if dtype.hasobject or np.dtype(dtype.str) != dtype:
                return None
            plain = _PLAIN[dtype] = (dtype.str, dtype.kind in "biufc")
        total += array.nbytes
        specs.append([name, plain[0], list(array.shape)])
        # (memoryview refuses datetimes, and to cast an empty array to bytes)
        buffers.append(array if plain[1] and array.size else array.reshape(-1).view(np.uint8))
    if total > limit:
        return None
    return {"tensors": specs, "meta": {} if meta is None else dict(meta)}, buffers


def inline_message(batch: Batch) -> tuple[Header, list[Any]]:
    descriptor, buffers = inline_parts(batch)
    return {"op": "data", "xid": 0, "t": INLINE, "d": descriptor}, buffers


def copy_aligned(buffers: list[Any]) -> list[memoryview]:
    """Private copies of `buffers` in one 64-byte aligned block, each buffer starting
    aligned (what a received frame gives): for handing inline payloads over in-process."""
    views = [memoryview(b).cast("B") if memoryview(b).nbytes else memoryview(b"")
             for b in buffers]
    offsets, total = [], 0
    for view in views:
        offsets.append(total)
        total += align(view.nbytes)
    block = memoryview(pa.allocate_buffer(max(total, 1), resizable=False)).cast("B")
    out = []
    for view, offset in zip(views, offsets, strict=True):
        target = block[offset:offset + view.nbytes]
        target[:] = view
        out.append(target)
    return out


_DTYPES: dict[str, np.dtype[Any]] = {}
"""Validated dtypes by their `dtype.str` (parsing one costs microseconds per message)."""


def _array_spec(entry: Any, fields: int) -> tuple[str, np.dtype[Any], tuple[int, ...], int]:
    """Validate one received array description ``[name, dtype, shape(, offset)]``.

    Nothing from a peer is trusted: a negative or non-integer dimension, an object dtype or a
    negative offset would make numpy read memory the sender never described.
    """
    if not isinstance(entry, list | tuple) or len(entry) != fields:
        raise errors.CodecError(f"expected an array description of {fields} fields "
                                f"[name, dtype, shape{', offset' if fields == 4 else ''}]; "
                                f"got {entry!r:.200}")
    name, dtype, shape = entry[0], entry[1], entry[2]
    offset = entry[3] if fields == 4 else 0
    if not isinstance(name, str) or not isinstance(dtype, str):
        raise errors.CodecError(f"expected a str name and dtype; got {name!r:.80}, "
                                f"{dtype!r:.80}")
    dt = _DTYPES.get(dtype)
    if dt is None:
        try:
            dt = np.dtype(dtype)
        except (TypeError, ValueError) as exc:
            raise errors.CodecError(f"array {name!r}: {dtype!r:.80} is not a dtype") from exc
        if dt.hasobject:
            raise errors.CodecError(f"expected a plain dtype for {name!r}; got {dtype!r}")
        if len(_DTYPES) < 1024:  # a peer naming endless dtypes cannot grow it unbounded
            _DTYPES[dtype] = dt
    if not isinstance(shape, list | tuple) or not all(
            type(d) is int and d >= 0 for d in shape):  # (a bool or an int subclass: refused)
        raise errors.CodecError(f"array {name!r}: expected a shape of integers >= 0; got "
                                f"{shape!r:.200}")
    if not isinstance(offset, int) or isinstance(offset, bool) or offset < 0:
        raise errors.CodecError(f"array {name!r}: expected an offset >= 0; got {offset!r:.80}")
    return name, dt, tuple(shape), offset


def _view(buf: Any, name: str, dt: np.dtype[Any], shape: tuple[int, ...],
          offset: int) -> np.ndarray:
    count = math.prod(shape)  # exact: a huge shape cannot wrap around
    size = memoryview(buf).nbytes
    if offset + count * dt.itemsize > size:
        raise errors.CodecError(f"array {name!r} ({count} x {dt.str} at offset {offset}) "
                                f"overruns its {size}-byte buffer")
    return np.frombuffer(buf, dtype=dt, count=count, offset=offset).reshape(shape)


def open_inline(descriptor: Header, buffers: Buffers) -> Batch:
    specs = descriptor.get("tensors") if isinstance(descriptor, dict) else None
    if not isinstance(specs, list):
        raise errors.CodecError(f"expected a list of array descriptions; got {specs!r:.200}")
    if len(specs) != len(buffers):
        raise errors.CodecError(f"expected {len(specs)} buffers; got {len(buffers)}")
    tensors = {}
    for entry, buf in zip(specs, buffers, strict=True):
        name, dt, shape, _ = _array_spec(entry, 3)
        # The frame buffer belongs to us alone (wire's contract): a zero-copy view.
        tensors[name] = _view(buf, name, dt, shape, 0)
        if tensors[name].nbytes != memoryview(buf).nbytes:
            raise errors.CodecError(f"array {name!r}: {tensors[name].nbytes} bytes described, "
                                    f"{memoryview(buf).nbytes} received")
    # Validated here, and the metadata came out of JSON: no need to validate again.
    return Batch.from_trusted(tensors, _meta(descriptor.get("meta", {})))


def _meta(meta: Any) -> dict[str, Any]:
    if not isinstance(meta, dict):
        raise errors.CodecError(f"expected batch metadata as an object; got {meta!r:.200}")
    return meta


# Copies of large payloads into shared memory are split across a few threads (numpy releases
# the GIL while copying): one core rarely saturates memory bandwidth, and the copy is the
# whole cost of a put.
_PARALLEL_COPY_MIN = 8 << 20
_COPY_THREADS = max(1, min(4, os.cpu_count() or 1))


class _Copier:
    """The process's copy threads, started on first use."""

    lock = threading.Lock()
    pool: ThreadPoolExecutor | None = None

    @classmethod
    def get(cls) -> ThreadPoolExecutor:
        with cls.lock:
            if cls.pool is None:
                cls.pool = ThreadPoolExecutor(_COPY_THREADS - 1, thread_name_prefix="rlinf-copy")
            return cls.pool


def copy_bytes(dst: np.ndarray, src: np.ndarray) -> None:
    """`np.copyto(dst, src)` for 1-D uint8 arrays, in parallel chunks when large."""
    n = src.nbytes
    if n < _PARALLEL_COPY_MIN or _COPY_THREADS == 1:
        np.copyto(dst, src)
        return
    copier = _Copier.get()
    step = (-(-n // _COPY_THREADS) + 4095) & ~4095  # page-aligned chunks
    bounds = [(a, min(a + step, n)) for a in range(0, n, step)]
    futures = [copier.submit(np.copyto, dst[a:b], src[a:b]) for a, b in bounds[1:]]
    np.copyto(dst[bounds[0][0]:bounds[0][1]], src[bounds[0][0]:bounds[0][1]])
    for fut in futures:
        fut.result()


class RawLayout:
    """Small plain-numpy batches in an arena: raw bytes at aligned offsets, described in
    the JSON descriptor (dtype, shape, offset). Same zero-copy result as the Arrow codec
    for these batches, at a fraction of its per-item cost (which dominates small items)."""

    def __init__(self, batch: Batch, arrays: list[tuple[str, np.ndarray]]) -> None:
        self.meta = dict(batch.meta)
        self.arrays = arrays
        self.offsets = []
        size = 0
        for _, array in arrays:
            self.offsets.append(size)
            size = align(size + array.nbytes)
        self.nbytes = max(size, 1)

    @classmethod
    def of(cls, batch: Batch) -> RawLayout | None:
        arrays = []
        for name, array in batch.tensors.items():
            if type(array) is not np.ndarray or array.dtype.hasobject:
                return None
            if np.dtype(array.dtype.str) != array.dtype:
                return None
            arrays.append((name, array))
        return cls(batch, arrays)

    def write_into(self, dest: memoryview) -> int:
        for (_, array), offset in zip(self.arrays, self.offsets, strict=True):
            if array.flags.c_contiguous:
                target = np.frombuffer(dest, dtype=np.uint8, count=array.nbytes, offset=offset)
                copy_bytes(target, array.reshape(-1).view(np.uint8))
            else:
                target = np.frombuffer(dest, dtype=array.dtype, count=array.size, offset=offset)
                np.copyto(target.reshape(array.shape), array)
        return self.nbytes

    def describe(self) -> Header:
        tensors = [[name, a.dtype.str, list(a.shape), off]
                   for (name, a), off in zip(self.arrays, self.offsets, strict=True)]
        return {"tensors": tensors, "meta": self.meta}


Packed = RawLayout | codec.EncodePlan


def open_raw(descriptor: Header, *, on_release: Callable[[], None] | None) -> Batch:
    """Map a `RawLayout` payload: arrays are views on the shared segment."""
    raw = descriptor.get("raw")
    if not isinstance(raw, dict) or not isinstance(raw.get("tensors"), list):
        raise errors.CodecError(f"expected a raw layout with a list of arrays; got {raw!r:.200}")
    specs = raw["tensors"]
    checked = [_array_spec(entry, 4) for entry in specs]  # before mapping anything
    meta = _meta(raw.get("meta", {}))
    try:
        name, offset, nbytes = (str(descriptor["name"]), int(descriptor["offset"]),
                                int(descriptor["nbytes"]))
    except (KeyError, TypeError, ValueError) as exc:
        raise errors.CodecError(f"malformed raw descriptor ({type(exc).__name__}: {exc})"
                                ) from exc
    view = shm.default_reader().open_view(name, offset, nbytes, on_release=on_release)
    tensors = {}
    for array, dt, shape, at in checked:
        tensors[array] = _view(view, array, dt, shape, at)
    return Batch(tensors, meta)
