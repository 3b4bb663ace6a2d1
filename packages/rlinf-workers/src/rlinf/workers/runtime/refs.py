"""Waiting on call results of either backend: Ray object refs or `LocalRef` futures.

One wait never mixes the two: a run's groups all run on Ray or all as local processes.
"""

from __future__ import annotations

import concurrent.futures as cf
import time
from collections.abc import Sequence
from typing import Any

from rlinf.workers.runtime.local import LocalRef

__all__ = ["get", "wait"]


def wait(refs: Sequence[Any], *, num_returns: int = 1, timeout: float | None = None
         ) -> tuple[list[Any], list[Any]]:
    """``(ready, pending)`` once `num_returns` of `refs` are done or `timeout` passed, as
    ``ray.wait`` (the order of `refs` kept in both lists)."""
    if not refs or not isinstance(refs[0], LocalRef):
        import ray

        ready, pending = ray.wait(list(refs), num_returns=num_returns, timeout=timeout)
        return list(ready), list(pending)
    deadline = None if timeout is None else time.monotonic() + timeout
    while True:
        done = [ref for ref in refs if ref.future.done()]
        left = None if deadline is None else deadline - time.monotonic()
        if len(done) >= num_returns or (left is not None and left <= 0):
            break
        cf.wait([ref.future for ref in refs if not ref.future.done()], timeout=left,
                return_when=cf.FIRST_COMPLETED)
    ready = done[:num_returns]
    chosen = {id(ref) for ref in ready}
    return ready, [ref for ref in refs if id(ref) not in chosen]


def get(ref: Any, *, timeout: float | None = None) -> Any:
    """The result of `ref` (its error raised), waiting at most `timeout`."""
    if isinstance(ref, LocalRef):
        try:
            return ref.future.result(timeout=timeout)
        except cf.TimeoutError:
            raise TimeoutError(f"no result within {timeout} s") from None
    import ray

    return ray.get(ref, timeout=timeout)
