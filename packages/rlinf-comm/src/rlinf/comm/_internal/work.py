"""`Work`: the handle a non-blocking operation (`isend`, `irecv`) returns.

Named after torch.distributed's `Work`, without its flaw: `isend`/`irecv` always return a
`Work`, and `wait` always returns the operation's result (None for sends, a Batch for
receives) or raises its typed error.
"""

from __future__ import annotations

import asyncio
from concurrent.futures import Future
from typing import Generic, TypeVar

from rlinf.comm import errors

T = TypeVar("T")


class Work(Generic[T]):
    """Handle to an operation running in the background.

    `wait(timeout)` blocks until it finishes and returns its result or raises its error;
    `done()` polls. Waiting past `timeout` raises CommTimeoutError but leaves the operation
    running: wait again to keep waiting.
    """

    def __init__(self, future: Future[T], *, description: str) -> None:
        self._future = future
        self._description = description

    @classmethod
    def completed(cls, result: T, *, description: str) -> Work[T]:
        fut: Future[T] = Future()
        fut.set_result(result)
        return cls(fut, description=description)

    def done(self) -> bool:
        """True once the operation finished, successfully or not (never blocks)."""
        return self._future.done()

    def wait(self, timeout: float | None = None) -> T:
        """The operation's result; CommTimeoutError if it is not done within `timeout` s.

        `timeout=None` waits as long as the operation's own timeout allows (every
        operation carries one, so this still never hangs forever).
        """
        try:
            return self._future.result(timeout=timeout)
        except TimeoutError as exc:
            if isinstance(exc, errors.CommError):
                raise
            raise errors.CommTimeoutError(
                f"expected {self._description} to finish within {timeout} s; it is still running"
            ) from None

    async def wait_async(self) -> T:
        """Await the result from asyncio code without blocking the event loop."""
        return await asyncio.wrap_future(self._future)

    def __repr__(self) -> str:
        state = "done" if self.done() else "pending"
        return f"Work({self._description}, {state})"
