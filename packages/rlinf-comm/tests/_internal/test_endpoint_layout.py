"""Received array descriptions are validated before numpy reads a byte (issue #13, item 7)."""

from __future__ import annotations

import numpy as np
import pytest

from rlinf.comm._internal.endpoint_layout import open_inline
from rlinf.comm.errors import CodecError

BUF = np.arange(16, dtype=np.uint8)


def descriptor(*spec: object) -> dict[str, object]:
    return {"tensors": [list(spec)], "meta": {}}


def test_a_valid_description_is_a_zero_copy_view() -> None:
    batch = open_inline(descriptor("x", "<f4", [2, 2]), [BUF])
    assert batch["x"].shape == (2, 2) and batch["x"].base is not None


@pytest.mark.parametrize("spec, match", [
    (("x", "<f4", [-4]), "shape"),            # was accepted, reading 16 elements
    (("x", "<f4", [-5]), "shape"),
    (("x", "<f4", [2.0, 2]), "shape"),
    (("x", "<f4", [True, 4]), "shape"),
    (("x", "<f4", "4"), "shape"),
    (("x", "not-a-dtype", [4]), "dtype"),
    (("x", "|O", [4]), "plain dtype"),
    ((3, "<f4", [4]), "str name"),
    (("x", "<f4", [8]), "overruns"),
    (("x", "<f4", [2]), "received"),
    (("x", "<f4"), "3 fields"),
])
def test_malformed_descriptions_raise_codec_errors(spec: tuple[object, ...], match: str) -> None:
    with pytest.raises(CodecError, match=match):
        open_inline(descriptor(*spec), [BUF])


def test_malformed_descriptor_shapes_raise_codec_errors() -> None:
    with pytest.raises(CodecError, match="list of array"):
        open_inline({"tensors": "x"}, [BUF])
    with pytest.raises(CodecError, match="buffers"):
        open_inline(descriptor("x", "<f4", [4]), [BUF, BUF])
    with pytest.raises(CodecError, match="metadata"):
        open_inline({"tensors": [["x", "<f4", [4]]], "meta": [1]}, [BUF])


def test_raw_descriptors_are_checked_before_any_segment_is_mapped() -> None:
    from rlinf.comm._internal.endpoint_layout import open_raw

    fake = {"name": "rlinf-" + "0" * 32, "offset": 0, "nbytes": 64,
            "raw": {"tensors": [["x", "<f4", [-5], 0]], "meta": {}}}
    with pytest.raises(CodecError, match="shape"):
        open_raw(fake, on_release=None)
    fake["raw"] = {"tensors": [["x", "<f4", [4], -8]]}
    with pytest.raises(CodecError, match="offset"):
        open_raw(fake, on_release=None)
    with pytest.raises(CodecError, match="raw layout"):
        open_raw({"raw": None}, on_release=None)


def test_inline_items_are_described_in_one_pass_or_left_to_the_general_path() -> None:
    from rlinf.comm import Batch
    from rlinf.comm._internal.endpoint_layout import inline_item

    grid = np.arange(12, dtype=np.float32).reshape(3, 4)
    descriptor, buffers = inline_item({"g": grid, "s": np.array(7)}, 1 << 16)
    assert descriptor == {"tensors": [["g", "<f4", [3, 4]], ["s", grid.dtype.str[0] + "i8",
                                                               []]], "meta": {}}
    assert buffers[0] is grid  # sent from the caller's memory, as is
    descriptor, _ = inline_item(Batch({"g": grid}, meta={"step": 3}), 1 << 16)
    assert descriptor["meta"] == {"step": 3}
    assert inline_item({"g": grid}, 10) is None  # over the limit
    assert inline_item({"g": grid[:, ::2]}, 1 << 16) is None  # strided: general path
    assert inline_item({"o": np.array([None])}, 1 << 16) is None
    assert inline_item({"r": np.zeros(2, dtype=[("a", "<i4")])}, 1 << 16) is None
    assert inline_item([("g", grid)], 1 << 16) is None
    _, (empty, when) = inline_item({"e": np.zeros((0, 2)), "t": np.arange(2).astype("M8[s]")},
                                   1 << 16)
    assert bytes(memoryview(empty)) == b"" and memoryview(when).nbytes == 16


def test_zero_d_arrays_keep_their_shape_inline_and_copies_are_aligned() -> None:
    from rlinf.comm import Batch
    from rlinf.comm._internal.endpoint_layout import copy_aligned, inline_parts

    batch = Batch({"s": np.array(2.5), "v": np.arange(3, dtype=np.int16)})
    descriptor, buffers = inline_parts(batch)
    copies = copy_aligned(buffers)
    assert all(np.frombuffer(c, np.uint8).ctypes.data % 64 == 0 for c in copies if c.nbytes)
    got = open_inline(descriptor, copies)
    assert got["s"].shape == () and float(got["s"]) == 2.5  # was (1,): ascontiguousarray
    assert got["v"].tolist() == [0, 1, 2]
