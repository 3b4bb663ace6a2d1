"""Tests of rlinf.comm._internal.codec: round trips, zero-copy decoding, one-copy encoding."""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

from rlinf.comm import Batch
from rlinf.comm._internal import codec
from rlinf.comm.errors import CodecError

NUMPY_DTYPES = [np.bool_, np.int8, np.int16, np.int32, np.int64, np.uint8, np.uint16,
                np.uint32, np.uint64, np.float16, np.float32, np.float64, np.complex64,
                np.complex128, np.dtype("<M8[ns]"), np.dtype(">i4"), np.dtype("S3"),
                np.dtype([("x", "<f4"), ("y", "u1", (2,))])]
TORCH_DTYPES = [torch.bool, torch.uint8, torch.int8, torch.int16, torch.int32, torch.int64,
                torch.float16, torch.bfloat16, torch.float32, torch.float64, torch.complex64,
                torch.complex128, torch.uint16, torch.uint32, torch.uint64,
                torch.float8_e4m3fn, torch.float8_e5m2]

shapes = hnp.array_shapes(min_dims=0, max_dims=4, min_side=0, max_side=5)


@st.composite
def numpy_arrays(draw: st.DrawFn) -> np.ndarray:
    dtype = np.dtype(draw(st.sampled_from(NUMPY_DTYPES)))
    shape = draw(shapes)
    raw = draw(st.binary(min_size=dtype.itemsize * int(np.prod(shape)),
                         max_size=dtype.itemsize * int(np.prod(shape))))
    array = np.frombuffer(raw, dtype=np.uint8).view(dtype).reshape(shape).copy()
    return draw(_maybe_strided(array))


@st.composite
def _maybe_strided(draw: st.DrawFn, array: np.ndarray) -> np.ndarray:
    how = draw(st.sampled_from(["plain", "transpose", "step", "negative"]))
    if how == "transpose" and array.ndim >= 2:
        return array.T
    if how == "step" and array.ndim >= 1:
        return np.repeat(array, 2, axis=0)[::2]
    if how == "negative" and array.ndim >= 1:
        return array[::-1]
    return array


@st.composite
def torch_tensors(draw: st.DrawFn) -> torch.Tensor:
    dtype = draw(st.sampled_from(TORCH_DTYPES))
    shape = draw(shapes)
    itemsize = torch.empty((), dtype=dtype).element_size()
    n = int(np.prod(shape)) * itemsize
    raw = bytearray(draw(st.binary(min_size=n, max_size=n)))
    tensor = torch.frombuffer(raw, dtype=torch.uint8) if n else torch.empty(0, dtype=torch.uint8)
    tensor = tensor.view(dtype).reshape(shape).clone()
    if draw(st.booleans()) and tensor.ndim >= 2:
        tensor = tensor.transpose(0, -1)
    return tensor


json_values = st.recursive(
    st.none() | st.booleans() | st.integers(-(2**53), 2**53) | st.text(max_size=8)
    | st.floats(allow_nan=False, allow_infinity=False),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=5), inner,
                                                                  max_size=3),
    max_leaves=8)
names = st.text(min_size=1, max_size=12)


def _bits(x: np.ndarray | torch.Tensor) -> bytes:
    """Bitwise content in C order (NaN-safe equality)."""
    if isinstance(x, torch.Tensor):
        if x.numel() == 0:
            return b""
        x = x.contiguous().reshape(-1).view(torch.uint8).numpy()
    return np.ascontiguousarray(x).tobytes()


@settings(max_examples=120, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(tensors=st.dictionaries(names, numpy_arrays(), max_size=6),
       meta=st.dictionaries(st.text(max_size=6), json_values, max_size=4))
def test_numpy_round_trip(tensors, meta):
    batch = Batch(tensors, meta)
    buf = codec.encode(batch)
    assert buf.size == codec.encoded_size(batch)
    out = codec.decode(buf)
    assert dict(out.meta) == meta
    assert list(out.tensors) == list(tensors)
    for name, src in tensors.items():
        got = out.tensors[name]
        assert got.dtype == src.dtype
        assert got.shape == src.shape
        assert _bits(got) == _bits(src)


@settings(max_examples=80, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(tensors=st.dictionaries(names, torch_tensors(), min_size=1, max_size=5))
def test_torch_round_trip_including_bfloat16_and_float8(tensors):
    out = codec.decode(codec.encode(Batch(tensors)), to="torch")
    for name, src in tensors.items():
        got = out.tensors[name]
        assert isinstance(got, torch.Tensor)
        assert got.dtype == src.dtype
        assert tuple(got.shape) == tuple(src.shape)
        assert _bits(got) == _bits(src)


def test_many_columns_and_empty_batch():
    tensors = {f"c{i}": np.full((i % 4,), i, dtype=np.int32) for i in range(500)}
    out = codec.decode(codec.encode(Batch(tensors, {"step": 7})))
    assert len(out) == 500 and out.meta == {"step": 7}
    assert all(np.array_equal(out[k], v) for k, v in tensors.items())
    empty = codec.decode(codec.encode(Batch({}, {"only": "meta"})))
    assert len(empty) == 0 and empty.meta == {"only": "meta"}


def _inside(addr: int, buf: pa.Buffer) -> bool:
    return buf.address <= addr < buf.address + buf.size


def test_decode_returns_views_on_the_buffer():
    batch = Batch({"a": np.arange(1000, dtype=np.float64), "b": np.ones((3, 4), np.int16),
                   "t": torch.arange(10, dtype=torch.bfloat16)})
    buf = codec.encode(batch)
    out = codec.decode(buf, to="torch")
    for tensor in out.tensors.values():
        assert _inside(tensor.data_ptr(), buf)
    host_buf = codec.encode(Batch({"a": batch["a"], "b": batch["b"]}))
    host = codec.decode(host_buf)
    assert _inside(host["a"].ctypes.data, host_buf)
    assert host["a"].ctypes.data % 8 == 0  # aligned: viewable at full speed
    # Writing through one decoding is seen by another: same memory, no copy.
    region = memoryview(bytearray(codec.encoded_size(batch)))
    codec.encode_into(batch, region)
    first, second = codec.decode(region, to="torch"), codec.decode(region, to="torch")
    first["a"][3] = -1.0
    assert second["a"][3].item() == -1.0
    view = np.frombuffer(region, dtype=np.uint8)
    assert np.shares_memory(first["a"].numpy(), view)
    assert np.shares_memory(codec.decode(region, to="torch")["b"].numpy(), view)


def test_decoded_arrays_keep_the_buffer_alive():
    buf = codec.encode(Batch({"a": np.arange(100, dtype=np.int64)}))
    arr = codec.decode(buf)["a"]
    del buf
    assert arr.sum() == 4950


def test_strided_array_is_copied_once_straight_into_place(monkeypatch):
    source = np.arange(4096, dtype=np.float32).reshape(64, 64)[::2, ::3]
    copies = []
    real_copyto = np.copyto

    def spy(dst, src, *args, **kwargs):
        copies.append((dst.ctypes.data, dst.nbytes))
        return real_copyto(dst, src, *args, **kwargs)

    monkeypatch.setattr(codec.np, "copyto", spy)
    plan = codec.plan_encoding({"s": source})
    dest = pa.allocate_buffer(plan.nbytes)
    plan.write_into(memoryview(dest))
    out = codec.decode(dest)["s"]
    assert np.array_equal(out, source)
    # One gather by numpy, written exactly where the decoder finds the column's bytes.
    assert copies == [(out.ctypes.data, source.nbytes)]


def test_encode_into_checks_destination():
    batch = Batch({"a": np.zeros(10)})
    with pytest.raises(CodecError, match="at least"):
        codec.encode_into(batch, memoryview(bytearray(10)))
    with pytest.raises(CodecError, match="writable"):
        codec.encode_into(batch, memoryview(bytes(codec.encoded_size(batch))))


def test_decode_rejects_garbage_and_foreign_streams():
    with pytest.raises(CodecError):
        codec.decode(b"\x00" * 64)
    sink = pa.BufferOutputStream()
    table = pa.table({"x": [1, 2]})
    with pa.ipc.new_stream(sink, table.schema) as writer:
        writer.write_table(table)
    with pytest.raises(CodecError, match="metadata"):
        codec.decode(sink.getvalue())


def test_bfloat16_to_numpy_needs_ml_dtypes_or_torch():
    buf = codec.encode({"w": torch.ones(3, dtype=torch.bfloat16)})
    try:
        import ml_dtypes  # noqa: F401
    except ImportError:
        with pytest.raises(CodecError, match="to='torch'"):
            codec.decode(buf)
    else:
        assert codec.decode(buf)["w"].dtype.name == "bfloat16"


def test_unsupported_inputs_raise_codec_error():
    with pytest.raises(CodecError, match="JSON"):
        Batch({}, {"bad": object()})
    with pytest.raises(CodecError):
        Batch({"x": [1, 2, 3]})
    with pytest.raises(CodecError, match="to="):
        codec.decode(codec.encode({}), to="jax")  # type: ignore[arg-type]
    with pytest.raises(CodecError, match="object"):
        codec.encode({"o": np.array([object()])})


def test_requires_grad_and_conjugate_tensors_encode_their_values():
    leaf = torch.arange(4.0, requires_grad=True)
    conj = torch.tensor([1 + 2j, 3 - 1j], dtype=torch.complex64).conj()
    out = codec.decode(codec.encode({"g": leaf, "c": conj}), to="torch")
    assert torch.equal(out["g"], leaf.detach())
    assert torch.equal(out["c"], conj.resolve_conj())


def _tampered(field_meta: dict[bytes, bytes], data: bytes = b"\x00" * 16) -> pa.Buffer:
    """An rlinf-shaped stream whose column metadata says what the test wants."""
    offsets = pa.py_buffer(np.array([0, len(data)], dtype=np.int64))
    column = pa.Array.from_buffers(pa.large_binary(), 1, [None, offsets, pa.py_buffer(data)])
    schema = pa.schema([pa.field("x", pa.large_binary(), metadata=field_meta)],
                       metadata={b"rlinf.meta": b"{}"})
    sink = pa.BufferOutputStream()
    with pa.ipc.new_stream(sink, schema) as writer:
        writer.write_batch(pa.RecordBatch.from_arrays([column], schema=schema))
    return sink.getvalue()


@pytest.mark.parametrize("meta, match", [
    ({b"rlinf.dtype": b'"|O"', b"rlinf.shape": b"[2]"}, "plain-data"),
    ({b"rlinf.dtype": b'"<f8"', b"rlinf.shape": b"[-2]"}, "non-negative"),
    ({b"rlinf.dtype": b'"<f8"', b"rlinf.shape": b"[3]"}, "expected 24 bytes"),
    ({b"rlinf.dtype": b'"not a dtype"', b"rlinf.shape": b"[2]"}, "numpy dtype"),
    ({b"rlinf.dtype": b'"<f8"', b"rlinf.shape": b'["x"]'}, "consistent"),
])
def test_decode_refuses_inconsistent_or_unsafe_columns(meta, match):
    with pytest.raises(CodecError, match=match):
        codec.decode(_tampered(meta))
