"""Split/gather rules without Ray: chunk sizes, kinds of values, errors."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from rlinf.workers.errors import DispatchError
from rlinf.workers.runtime import (
    PER_RANK_ALL,
    RANK_ZERO,
    SCATTER_CONCAT,
    DispatchSpec,
    Gather,
    concat_values,
    split_value,
)
from rlinf.workers.runtime.dispatch import gather_results, split_arguments


def test_split_sizes_follow_tensor_split() -> None:
    # 5 items over 3 ranks: the first 5 % 3 = 2 ranks get one more -> 2, 2, 1
    chunks = split_value(torch.arange(5), 3)
    assert [c.tolist() for c in chunks] == [[0, 1], [2, 3], [4]]
    assert [c.tolist() for c in split_value(np.arange(5), 3)] == [[0, 1], [2, 3], [4]]
    assert split_value([1, 2, 3, 4, 5], 3) == [[1, 2], [3, 4], [5]]
    assert split_value((1, 2), 3) == [(1,), (2,), ()]


def test_split_dict_and_round_trip() -> None:
    batch = {"ids": torch.arange(6).reshape(3, 2), "reward": np.array([1.0, 2.0, 3.0]),
             "text": ["a", "b", "c"]}
    parts = split_value(batch, 2)
    assert parts[0]["text"] == ["a", "b"]
    assert parts[1]["ids"].tolist() == [[4, 5]]
    back = concat_values(parts)
    assert torch.equal(back["ids"], batch["ids"])
    assert np.array_equal(back["reward"], batch["reward"])
    assert back["text"] == batch["text"]


def test_split_errors_name_the_problem() -> None:
    with pytest.raises(DispatchError, match="differ in length"):
        split_value({"a": [1, 2], "b": [1]}, 2)
    with pytest.raises(DispatchError, match=r"type int"):
        split_value(3, 2)
    with pytest.raises(DispatchError, match="0-d tensor"):
        split_value(torch.tensor(1.0), 2)
    with pytest.raises(DispatchError, match=r"Gather\.ALL"):
        concat_values([1, 2])
    with pytest.raises(DispatchError, match="different keys"):
        concat_values([{"a": [1]}, {"b": [2]}])


def test_split_arguments_per_spec() -> None:
    scattered = split_arguments(SCATTER_CONCAT, ([1, 2, 3, 4],), {"w": [5, 6, 7, 8]}, 2)
    assert scattered == [(([1, 2],), {"w": [5, 6]}), (([3, 4],), {"w": [7, 8]})]
    per_rank = split_arguments(PER_RANK_ALL, (["a", "b"],), {}, 2)
    assert per_rank == [(("a",), {}), (("b",), {})]
    assert split_arguments(RANK_ZERO, (1,), {"k": 2}, 1) == [((1,), {"k": 2})]
    with pytest.raises(DispatchError, match="sequence of 2 items"):
        split_arguments(PER_RANK_ALL, (["a"],), {}, 2)


def test_gather_modes() -> None:
    results = [[1], [2, 3]]
    assert gather_results(DispatchSpec(gather=Gather.ALL), results) == [[1], [2, 3]]
    assert gather_results(DispatchSpec(gather=Gather.FIRST), results) == [1]
    assert gather_results(DispatchSpec(gather=Gather.CONCAT), results) == [1, 2, 3]
    assert gather_results(DispatchSpec(gather=Gather.NONE), results) is None


@settings(max_examples=50, deadline=None)
@given(st.integers(0, 40), st.integers(1, 8))
def test_split_then_concat_is_identity(length: int, parts: int) -> None:
    batch = {"t": torch.arange(length * 2).reshape(length, 2), "n": np.arange(length),
             "l": list(range(length))}
    chunks = split_value(batch, parts)
    sizes = [len(chunk["l"]) for chunk in chunks]
    assert len(chunks) == parts
    assert max(sizes) - min(sizes) <= 1
    assert sizes == sorted(sizes, reverse=True)  # the larger chunks come first
    back = concat_values(chunks)
    assert torch.equal(back["t"], batch["t"])
    assert np.array_equal(back["n"], batch["n"])
    assert back["l"] == batch["l"]
