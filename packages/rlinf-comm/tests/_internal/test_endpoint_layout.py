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
