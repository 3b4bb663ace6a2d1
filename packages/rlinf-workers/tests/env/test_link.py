import threading

import pytest

from rlinf.comm import Batch
from rlinf.workers.env import KeyedQueue, LinkClosedError, LinkTimeoutError, stage_key


def _batch(value: int) -> Batch:
    import numpy as np

    return Batch({"x": np.array([value])})


def test_fifo_per_key_and_keys_independent():
    q = KeyedQueue()
    q.put(_batch(1), key=stage_key(0))
    q.put(_batch(2), key=stage_key(1))
    q.put(_batch(3), key=stage_key(0))
    assert int(q.get(key=stage_key(1)).tensors["x"][0]) == 2
    assert [int(q.get(key=stage_key(0)).tensors["x"][0]) for _ in range(2)] == [1, 3]


def test_get_times_out_with_typed_error():
    with pytest.raises(LinkTimeoutError, match="stage0"):
        KeyedQueue().get(key=stage_key(0), timeout=0.01)


def test_close_wakes_a_blocked_waiter_and_later_ones():
    q = KeyedQueue()
    errors: list[BaseException] = []

    def wait() -> None:
        try:
            q.get(key="a", timeout=30)
        except BaseException as exc:
            errors.append(exc)

    thread = threading.Thread(target=wait)
    thread.start()
    q.close()
    thread.join(timeout=30)
    assert not thread.is_alive()
    assert isinstance(errors[0], LinkClosedError)
    with pytest.raises(LinkClosedError):
        q.get(key="never-used", timeout=30)
    with pytest.raises(LinkClosedError):
        q.put(_batch(0), key="a")
