"""Encode a host `Batch` as one Arrow IPC stream; decode it back as zero-copy views.

Format: an Arrow IPC *stream* holding one record batch of one row. Every array is one
``large_binary`` column whose single value is the array's raw C-order bytes; the field
metadata carries the dtype (numpy ``descr``, plus the torch dtype name when the array
came from torch) and the shape; the schema metadata carries ``Batch.meta`` as JSON.

Why a record batch and not ``pa.Tensor`` IPC: Arrow tensors have no bool, complex,
bfloat16, float8, datetime or structured element types, and a tensor stream holds one
array per message with nowhere to put batch metadata. One record batch carries every
column and the metadata in a single message, any standard Arrow reader can open it,
and each value's bytes are 8-byte aligned in the body, so the receiver views them in
place (``np.frombuffer``), copying nothing.

Copies on the sending side: exactly one per array, straight into the destination.
Contiguous arrays are handed to Arrow's writer, which ``memcpy``s them into place. A
strided array is written by numpy (``np.copyto``) directly into the spot its bytes
occupy in the body — the offsets follow from Arrow's IPC layout rules (each buffer
padded to 8 bytes; validity, offsets, data per column; an 8-byte end-of-stream marker),
and we verify them after writing. Arrow is then given that same spot as the column's
source, so its own copy is a no-op ``memcpy(p, p)``.
"""

from __future__ import annotations

import json
import warnings
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any, Literal

import numpy as np
import pyarrow as pa

from rlinf.comm.batch import Array, Batch, array_kind
from rlinf.comm.errors import CodecError, MissingExtraError

__all__ = ["EncodePlan", "decode", "encode", "encode_into", "encoded_size", "plan_encoding"]

_META = b"rlinf.meta"
_DTYPE = b"rlinf.dtype"
_SHAPE = b"rlinf.shape"
_TORCH = b"rlinf.torch_dtype"
_EOS = 8  # continuation marker + zero length
_OFFSETS = 16  # one large_binary value: two int64 offsets


def _pad8(n: int) -> int:
    return (n + 7) & ~7


_UINT_OF_SIZE = {1: np.uint8, 2: np.uint16, 4: np.uint32, 8: np.uint64}


@dataclass(frozen=True)
class _Column:
    name: str
    array: np.ndarray  # host view of the source (may be strided); never copied here
    torch_dtype: str | None

    @property
    def nbytes(self) -> int:
        return int(self.array.nbytes)

    @property
    def contiguous(self) -> bool:
        return bool(self.array.flags.c_contiguous)

    def field(self) -> pa.Field:
        meta = {
            _DTYPE: json.dumps(np.lib.format.dtype_to_descr(self.array.dtype)),
            _SHAPE: json.dumps(list(self.array.shape)),
        }
        if self.torch_dtype is not None:
            meta[_TORCH] = self.torch_dtype
        return pa.field(self.name, pa.large_binary(), nullable=False, metadata=meta)


def _torch_host_view(tensor: Any) -> tuple[np.ndarray, str | None]:
    """A numpy view of a CPU tensor's elements (no copy) and its torch dtype name."""
    import torch

    if tensor.is_cuda or tensor.device.type != "cpu":
        raise CodecError(f"expected host memory, got a tensor on {tensor.device}; GPU data "
                         "goes through the cuda_ipc or nccl transport (or call .cpu())")
    if tensor.layout != torch.strided or tensor.is_quantized:
        raise CodecError(f"expected a dense strided tensor, got layout {tensor.layout}")
    t = tensor.detach().resolve_conj().resolve_neg()
    name = str(t.dtype).removeprefix("torch.")
    try:
        return t.numpy(), name
    except TypeError:
        # bfloat16, float8, complex32…: numpy has no such dtype; view the bits.
        size = t.element_size()
        if size not in _UINT_OF_SIZE:
            raise CodecError(f"expected a torch dtype of 1, 2, 4 or 8 bytes, got {t.dtype}"
                             ) from None
        bits = getattr(torch, f"uint{8 * size}")
        return t.view(bits).numpy(), name


def _columns(batch: Batch) -> list[_Column]:
    cols = []
    for name, array in batch.tensors.items():
        kind = array_kind(array)
        if kind == "numpy":
            if array.dtype.hasobject:
                raise CodecError(f"expected plain-data dtypes, got object dtype in {name!r}")
            cols.append(_Column(name, array, None))
        elif kind == "torch":
            view, tname = _torch_host_view(array)
            cols.append(_Column(name, view, tname))
        else:
            raise CodecError(f"expected host arrays, got a cupy array in {name!r}; GPU data "
                             "goes through the cuda_ipc or nccl transport")
    return cols


def _flat_bytes(array: np.ndarray) -> np.ndarray:
    """1-D uint8 view of a C-contiguous array (works for 0-d and any dtype)."""
    return array.reshape(-1).view(np.uint8)


class EncodePlan:
    """Layout of one batch's encoding; `nbytes` is exact. Holds references, no copies."""

    def __init__(self, batch: Batch) -> None:
        self.batch = batch
        self._columns = _columns(batch)
        meta = {_META: json.dumps(dict(batch.meta), allow_nan=False)}
        self._schema = pa.schema([c.field() for c in self._columns], metadata=meta)
        self._offsets = [pa.py_buffer(np.array([0, c.nbytes], dtype=np.int64))
                         for c in self._columns]
        # Size with a mock sink: only lengths matter, so strided columns stand in as
        # zero-filled placeholders of the right size that are never read.
        sink = pa.MockOutputStream()
        self._write(sink, [self._source(c, None, 0) for c in self._columns])
        self.nbytes = int(sink.size())
        body = sum(_OFFSETS + _pad8(c.nbytes) for c in self._columns)
        start = self.nbytes - _EOS - body
        self._data_offsets = []
        for c in self._columns:
            self._data_offsets.append(start + _OFFSETS)
            start += _OFFSETS + _pad8(c.nbytes)

    def _source(self, col: _Column, dest: pa.Buffer | None, offset: int) -> pa.Buffer:
        if col.contiguous:
            return pa.py_buffer(_flat_bytes(col.array))
        if dest is None:
            # np.zeros of a large size maps lazily zeroed pages: the mock never reads them.
            return pa.py_buffer(np.zeros(col.nbytes, dtype=np.uint8))
        return dest.slice(offset, col.nbytes)

    def _write(self, sink: Any, sources: list[pa.Buffer]) -> None:
        arrays = [pa.Array.from_buffers(pa.large_binary(), 1, [None, off, src])
                  for off, src in zip(self._offsets, sources, strict=True)]
        record = pa.RecordBatch.from_arrays(arrays, schema=self._schema)
        with pa.ipc.new_stream(sink, self._schema) as writer:
            writer.write_batch(record)

    def write_into(self, dest: memoryview) -> int:
        """Write the stream into `dest[:nbytes]`; returns `nbytes`. Caller owns `dest`."""
        if dest.readonly:
            raise CodecError("expected a writable destination, got a read-only buffer")
        if dest.nbytes < self.nbytes:
            raise CodecError(f"expected a destination of at least {self.nbytes} bytes, "
                             f"got {dest.nbytes}")
        target = pa.py_buffer(dest[:self.nbytes])
        strided = [(c, off) for c, off in zip(self._columns, self._data_offsets, strict=True)
                   if not c.contiguous]
        for col, off in strided:
            # The one copy of a strided array: numpy gathers it into its final place.
            np.copyto(_view_of(target, off, col.array.dtype, col.array.shape), col.array)
        sources = [self._source(c, target, off)
                   for c, off in zip(self._columns, self._data_offsets, strict=True)]
        sink = pa.FixedSizeBufferWriter(target)
        self._write(sink, sources)
        if sink.tell() != self.nbytes:
            raise CodecError(f"expected to write {self.nbytes} bytes, wrote {sink.tell()}")
        if strided:
            self._verify_layout(target)
        return self.nbytes

    def _verify_layout(self, target: pa.Buffer) -> None:
        record = pa.ipc.open_stream(target).read_next_batch()
        for col, off, column in zip(self._columns, self._data_offsets, record.columns,
                                    strict=True):
            data = column.buffers()[2]
            if col.nbytes and data.address != target.address + off:
                raise CodecError(
                    f"expected column {col.name!r} at offset {off} of the IPC body, found "
                    f"it at {data.address - target.address}: Arrow's layout changed")


def _view_of(buf: pa.Buffer, offset: int, dtype: np.dtype[Any],
             shape: tuple[int, ...]) -> np.ndarray:
    flat = np.frombuffer(buf, dtype=np.uint8, count=int(np.prod(shape, dtype=np.int64))
                         * dtype.itemsize, offset=offset)
    return flat.view(dtype).reshape(shape)


def plan_encoding(batch: Batch | dict[str, Array]) -> EncodePlan:
    """Prepare an encoding (sizes only, no copies); reuse it for `EncodePlan.write_into`."""
    return EncodePlan(Batch.of(batch))


def encoded_size(batch: Batch | dict[str, Array]) -> int:
    """Exact number of bytes `encode_into` writes for `batch`."""
    return plan_encoding(batch).nbytes


def encode_into(batch: Batch | dict[str, Array], dest: memoryview) -> int:
    """Encode `batch` into the writable buffer `dest`; returns the bytes written.

    The caller owns `dest`; the batch's arrays are only read during the call.
    """
    return plan_encoding(batch).write_into(memoryview(dest))


def encode(batch: Batch | dict[str, Array]) -> pa.Buffer:
    """Encode `batch` into a new Arrow buffer owned by the caller."""
    plan = plan_encoding(batch)
    out = pa.allocate_buffer(plan.nbytes)
    plan.write_into(memoryview(out))
    return out


Target = Literal["numpy", "torch", "auto"]


def decode(buf: Any, *, to: Target = "numpy") -> Batch:
    """Decode an encoded batch into zero-copy views on `buf`.

    The returned arrays reference `buf`'s memory (keeping `buf` alive) and are
    writable exactly when `buf` is. `to="torch"` returns CPU tensors sharing that
    memory; `to="numpy"` returns ndarrays (bfloat16/float8 need the optional
    ``ml_dtypes`` package for numpy, or ``to="torch"``); `to="auto"` gives each array
    back as the kind it was sent as (torch when the sender had torch tensors).
    """
    if to not in ("numpy", "torch", "auto"):
        raise CodecError(f"expected to='numpy', 'torch' or 'auto', got {to!r}")
    source = buf if isinstance(buf, pa.Buffer) else pa.py_buffer(buf)
    try:
        reader = pa.ipc.open_stream(source)
        record = reader.read_next_batch()
    except (pa.ArrowException, StopIteration) as exc:
        raise CodecError(f"expected an Arrow IPC stream with one record batch, got {exc}"
                         ) from exc
    schema = record.schema
    raw_meta = (schema.metadata or {}).get(_META)
    if raw_meta is None:
        raise CodecError("expected rlinf batch metadata in the Arrow schema, found none")
    try:
        tensors = {field.name: _decode_column(field, column, to)
                   for field, column in zip(schema, record.columns, strict=True)}
        meta = json.loads(raw_meta)
    except CodecError:
        raise
    except (TypeError, ValueError, OverflowError) as exc:
        raise CodecError(f"expected a consistent rlinf batch, got {exc}") from exc
    return Batch(tensors, meta)


def _decode_column(field: pa.Field, column: pa.Array, to: str) -> Array:
    meta = field.metadata or {}
    if field.type != pa.large_binary() or _DTYPE not in meta or _SHAPE not in meta:
        raise CodecError(f"expected column {field.name!r} to be an rlinf large_binary "
                         f"array with dtype and shape metadata, got {field.type}")
    if len(column) != 1:
        raise CodecError(f"expected one value in column {field.name!r}, got {len(column)}")
    try:
        dtype = np.lib.format.descr_to_dtype(_descr(json.loads(meta[_DTYPE])))
    except (TypeError, ValueError) as exc:
        raise CodecError(f"expected a numpy dtype for {field.name!r}, got {exc}") from exc
    if dtype.hasobject:
        # Object arrays built from received bytes would dereference arbitrary pointers.
        raise CodecError(f"expected a plain-data dtype for {field.name!r}, got {dtype}")
    shape = tuple(int(d) for d in json.loads(meta[_SHAPE]))
    if any(d < 0 for d in shape):
        raise CodecError(f"expected a non-negative shape for {field.name!r}, got {shape}")
    _, offsets_buf, data = column.buffers()
    start, stop = (int(v) for v in np.frombuffer(offsets_buf, dtype=np.int64, count=2,
                                                 offset=8 * column.offset))
    expected = int(np.prod(shape, dtype=np.int64)) * dtype.itemsize
    size = 0 if data is None else data.size
    if stop - start != expected or not 0 <= start <= stop <= size:
        raise CodecError(f"expected {expected} bytes for {field.name!r} {dtype} {shape} "
                         f"inside a {size}-byte body, got [{start}, {stop})")
    # Nothing to view for empty arrays (the body may not even hold a data buffer).
    array = np.empty(shape, dtype=dtype) if expected == 0 else _view_of(data, start, dtype,
                                                                         shape)
    torch_name = meta.get(_TORCH)
    if to == "torch" or (to == "auto" and torch_name is not None):
        return _to_torch(field.name, array, torch_name.decode() if torch_name else None)
    if torch_name is not None and array.dtype.kind == "u" and torch_name.decode() not in (
            "uint8", "uint16", "uint32", "uint64"):
        return _numpy_extension(field.name, array, torch_name.decode())
    return array


def _descr(value: Any) -> Any:
    # JSON turns descr tuples into lists; numpy wants tuples for structured fields.
    if isinstance(value, list):
        return [tuple(_descr(v) for v in item) if isinstance(item, list) else item
                for item in value]
    return value


def _numpy_extension(name: str, bits: np.ndarray, torch_name: str) -> np.ndarray:
    try:
        import ml_dtypes
    except ImportError:
        raise CodecError(f"column {name!r} holds torch.{torch_name}, which numpy cannot "
                         "represent; decode with to='torch' or install ml_dtypes") from None
    dtype = getattr(ml_dtypes, torch_name, None)
    if dtype is None:
        raise CodecError(f"expected a dtype ml_dtypes knows for {name!r}, got {torch_name}")
    return bits.view(dtype)


def _to_torch(name: str, array: np.ndarray, torch_name: str | None) -> Any:
    try:
        import torch
    except ImportError as exc:
        raise MissingExtraError("decoding to torch tensors", "torch", "torch") from exc
    with warnings.catch_warnings():
        # Read-only sources (bytes) give read-only tensors; the caller chose that buffer.
        warnings.simplefilter("ignore", UserWarning)
        try:
            tensor = torch.from_numpy(array)
        except TypeError as exc:
            raise CodecError(f"expected a dtype torch supports for {name!r}, got "
                             f"{array.dtype}") from exc
    if torch_name is not None and str(tensor.dtype).removeprefix("torch.") != torch_name:
        target = getattr(torch, torch_name, None)
        if not isinstance(target, torch.dtype):
            raise CodecError(f"expected a torch dtype name for {name!r}, got {torch_name!r}")
        tensor = tensor.view(target)
    return tensor


def iter_columns(batch: Batch) -> Iterator[tuple[str, np.ndarray]]:
    """Host numpy views of each array of `batch` (torch-only dtypes as raw bits)."""
    for col in _columns(batch):
        yield col.name, col.array
