"""Tests of rlinf.comm._internal.work: the handle of non-blocking operations."""

from __future__ import annotations

import asyncio
import threading
from concurrent.futures import Future

import pytest

from rlinf.comm._internal.work import Work
from rlinf.comm.errors import CommTimeoutError, PeerDiedError


def test_wait_returns_the_result_and_done_polls() -> None:
    fut: Future[int] = Future()
    work = Work(fut, description="op")
    assert not work.done()
    with pytest.raises(CommTimeoutError, match="still running"):
        work.wait(timeout=0.01)
    threading.Timer(0.05, fut.set_result, args=(7,)).start()
    assert work.wait(timeout=10) == 7
    assert work.done()
    assert Work.completed(None, description="send").wait() is None


def test_wait_raises_the_operations_typed_error() -> None:
    fut: Future[int] = Future()
    fut.set_exception(PeerDiedError("peer 'x' died"))
    with pytest.raises(PeerDiedError, match="'x'"):
        Work(fut, description="op").wait(timeout=1)
    late: Future[int] = Future()
    late.set_exception(CommTimeoutError("own deadline"))
    with pytest.raises(CommTimeoutError, match="own deadline"):
        Work(late, description="op").wait()


def test_wait_async_does_not_block_the_loop() -> None:
    fut: Future[str] = Future()
    work = Work(fut, description="op")

    async def main() -> str:
        asyncio.get_running_loop().call_later(0.02, fut.set_result, "ok")
        return await work.wait_async()

    assert asyncio.run(main()) == "ok"
