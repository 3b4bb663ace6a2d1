import numpy as np
import pytest
import torch
from threadpoolctl import threadpool_info

from rlinf.workers.runtime.threads import cpu_threads, set_cpu_threads


def _blas_threads() -> set[int]:
    return {pool["num_threads"] for pool in threadpool_info() if pool["user_api"] == "blas"}


@pytest.fixture(autouse=True)
def _restore_threads():
    before = torch.get_num_threads()
    yield
    set_cpu_threads(before)


def test_set_cpu_threads_sets_torch_and_numpys_blas_pool():
    np.ones((64, 64)) @ np.ones((64, 64))  # numpy's BLAS is loaded
    assert _blas_threads(), "no BLAS library found: the test would prove nothing"
    set_cpu_threads(1)
    assert torch.get_num_threads() == 1
    assert _blas_threads() == {1}
    set_cpu_threads(2)
    assert torch.get_num_threads() == 2
    assert _blas_threads() == {2}


def test_cpu_threads_restores_the_previous_count_of_both_pools():
    set_cpu_threads(2)
    with cpu_threads(1):
        assert torch.get_num_threads() == 1
        assert _blas_threads() == {1}
    assert torch.get_num_threads() == 2
    assert _blas_threads() == {2}
    with pytest.raises(RuntimeError), cpu_threads(1):
        raise RuntimeError("the block failed")
    assert _blas_threads() == {2}


def test_zero_threads_is_refused():
    with pytest.raises(ValueError, match="at least one thread"):
        set_cpu_threads(0)
