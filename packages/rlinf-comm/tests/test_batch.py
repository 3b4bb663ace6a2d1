"""Tests of rlinf.comm.Batch."""

from __future__ import annotations

import pickle

import numpy as np
import pytest
import torch

from rlinf.comm import Batch, CodecError
from rlinf.comm.batch import array_kind, array_nbytes, is_device_array


def test_holds_references_not_copies():
    x = np.arange(6)
    batch = Batch({"x": x}, {"step": 1})
    assert batch["x"] is x
    assert batch.nbytes == x.nbytes
    assert "x" in batch and len(batch) == 1 and list(batch.keys()) == ["x"]


def test_is_immutable():
    batch = Batch({"x": np.zeros(1)}, {"a": 1})
    with pytest.raises(TypeError):
        batch.tensors["y"] = np.zeros(1)  # type: ignore[index]
    with pytest.raises(TypeError):
        batch.meta["b"] = 2  # type: ignore[index]
    with pytest.raises(AttributeError):
        batch.meta = {}  # type: ignore[misc]


def test_of_normalises_mappings_and_passes_batches_through():
    batch = Batch.of({"t": torch.ones(2, 3, dtype=torch.bfloat16)})
    assert isinstance(batch, Batch) and Batch.of(batch) is batch
    assert batch.nbytes == 12
    with pytest.raises(CodecError, match="mapping"):
        Batch.of([np.zeros(1)])  # type: ignore[arg-type]


def test_numpy_scalars_become_zero_d_arrays():
    batch = Batch({"s": np.float32(2.5)})
    assert isinstance(batch["s"], np.ndarray) and batch["s"].shape == ()


def test_rejects_non_arrays_bad_names_and_non_json_meta():
    with pytest.raises(CodecError, match="ndarray"):
        Batch({"x": [1, 2]})
    with pytest.raises(CodecError, match="str"):
        Batch({1: np.zeros(1)})  # type: ignore[dict-item]
    with pytest.raises(CodecError, match="JSON"):
        Batch({}, {"x": np.zeros(1)})
    with pytest.raises(CodecError, match="JSON"):
        Batch({}, {"x": float("nan")})


def test_array_helpers():
    t = torch.zeros(4, 5, dtype=torch.float16)[:, ::2]
    assert array_kind(t) == "torch" and array_nbytes(t) == 4 * 3 * 2
    assert array_kind(torch.nn.Parameter(torch.zeros(1))) == "torch"
    assert array_kind(np.zeros(1)) == "numpy"
    assert not is_device_array(t) and not Batch({"t": t}).on_device


def test_pickles_for_ray_and_processes():
    batch = Batch({"x": np.arange(3)}, {"k": [1, "a"]})
    again = pickle.loads(pickle.dumps(batch))
    assert np.array_equal(again["x"], batch["x"]) and again.meta == {"k": [1, "a"]}


def test_a_value_that_is_not_an_array_is_named_with_where_it_belongs():
    with pytest.raises(CodecError, match=r"tensor 'info' is a dict, not .* meta=\{'info': "):
        Batch({"arr": np.zeros(3), "info": {"step": 1}})
    with pytest.raises(CodecError, match=r"tensor 'ids' is a list"):
        Batch({"ids": [1, 2]})
