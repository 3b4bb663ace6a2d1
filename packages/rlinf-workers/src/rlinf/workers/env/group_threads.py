"""`GroupThreads`: stage groups served concurrently, one thread each, on either side of the
env ↔ policy protocol.

With the envs in worker processes the env worker steps each stage group in its own thread,
and the policy answers each group's batches in its own thread, so that a group waiting for
a slow step or a multi-second reset holds up no other group (`EnvWorker.concurrent_groups`).
When one group fails, the others must not wait out the io timeout (minutes) for items that
will never come: their waits go in short slices (`get`) and end at the next slice.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor

from rlinf.comm import Batch
from rlinf.workers.env.link import ActionSource

__all__ = ["GroupThreads"]


class _Stopped(Exception):
    """A group thread stopped because another group failed."""


class GroupThreads:
    """Runs one task per stage group in its own thread (see the module docstring)."""

    CHECK_S = 0.5
    """Longest a group waits for an item before checking whether another group failed."""

    def __init__(self) -> None:
        self._failed = threading.Event()

    def get(self, source: ActionSource, *, key: str, timeout: float | None) -> Batch:
        """`source.get(key=key, timeout=timeout)`, ended early (by an internal exception that
        `run` discards) once another group has failed."""
        deadline = None if timeout is None else time.monotonic() + timeout
        while True:
            left = None if deadline is None else max(deadline - time.monotonic(), 0.0)
            wait = self.CHECK_S if left is None else min(left, self.CHECK_S)
            try:
                return source.get(key=key, timeout=wait)
            except TimeoutError:
                if self._failed.is_set():
                    raise _Stopped() from None
                if left is not None and left <= wait:
                    raise

    def run(self, tasks: Sequence[Callable[[], None]], *, name: str = "stage-group") -> None:
        """Run every task in its own thread and wait for all; raise the first real failure
        (the other groups stop at their next `get`)."""
        if not tasks:
            return

        def guarded(task: Callable[[], None]) -> None:
            try:
                task()
            except BaseException:
                self._failed.set()
                raise

        with ThreadPoolExecutor(len(tasks), thread_name_prefix=name) as pool:
            futures = [pool.submit(guarded, task) for task in tasks]
            errors = [f.exception() for f in futures]
        failures = [e for e in errors if e is not None]
        if failures:  # the failure itself, not a group it stopped
            raise next((e for e in failures if not isinstance(e, _Stopped)), failures[0])
