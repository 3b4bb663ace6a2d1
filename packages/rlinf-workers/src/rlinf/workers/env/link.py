"""How an env worker and a policy worker exchange micro-batches.

The env worker only needs an `ObsSink` (``put(item, *, key=...)``) and an `ActionSource`
(``get(*, key=..., timeout=...)``); an `rlinf.comm.Channel` is both, so the same worker code
runs against a cross-process channel or against `KeyedQueue`, the in-process (thread-safe)
equivalent used by the in-process drivers. Keys are per pipeline stage (`stage_key`), so the
items of one stage stay in order while stages interleave.
"""

from __future__ import annotations

import queue
import threading
from typing import Protocol

from rlinf.comm import Batch
from rlinf.workers.errors import WorkersError

__all__ = ["ActionSource", "KeyedQueue", "LinkClosedError", "LinkTimeoutError", "ObsSink",
           "ScopedLink", "stage_key"]


class LinkTimeoutError(WorkersError, TimeoutError):
    """No item arrived under a key within the timeout (the peer is stuck or dead)."""


class LinkClosedError(WorkersError, RuntimeError):
    """The link was closed (its peer failed) while waiting for an item."""


class ObsSink(Protocol):
    """Where an env worker sends observation micro-batches (e.g. an rlinf.comm Channel)."""

    def put(self, item: Batch, *, key: str | None = None) -> None: ...


class ActionSource(Protocol):
    """Where an env worker receives action micro-batches (e.g. an rlinf.comm Channel)."""

    def get(self, *, key: str | None = None, timeout: float | None = None) -> Batch: ...


def stage_key(stage: int) -> str:
    """Channel key of pipeline stage `stage`."""
    return f"stage{stage}"


class _Link(Protocol):
    def put(self, item: Batch, *, key: str | None = None) -> None: ...

    def get(self, *, key: str | None = None, timeout: float | None = None) -> Batch: ...


class ScopedLink:
    """A link whose keys carry a scope (``"stage0@e1"``), so that several env workers can
    share one channel to their policy without their stage keys meeting."""

    def __init__(self, link: _Link, scope: str) -> None:
        self._link = link
        self._scope = scope

    def _key(self, key: str | None) -> str:
        return f"{key}@{self._scope}"

    def put(self, item: Batch, *, key: str | None = None) -> None:
        """Put under the scoped `key`."""
        self._link.put(item, key=self._key(key))

    def get(self, *, key: str | None = None, timeout: float | None = None) -> Batch:
        """Get from under the scoped `key`."""
        return self._link.get(key=self._key(key), timeout=timeout)


class KeyedQueue:
    """In-process FIFO per key, safe across threads; `close()` wakes every waiter."""

    def __init__(self) -> None:
        self._queues: dict[str | None, queue.SimpleQueue[Batch | None]] = {}
        self._lock = threading.Lock()
        self._closed = False

    def _queue(self, key: str | None) -> queue.SimpleQueue[Batch | None]:
        with self._lock:
            found = self._queues.get(key)
            if found is None:
                found = self._queues[key] = queue.SimpleQueue()
                if self._closed:  # a waiter arriving after close() must not block forever
                    found.put(None)
            return found

    def put(self, item: Batch, *, key: str | None = None) -> None:
        """Append `item` under `key` (never blocks: a rollout bounds what is in flight)."""
        if self._closed:
            raise LinkClosedError(f"put on a closed link (key {key!r})")
        self._queue(key).put(item)

    def get(self, *, key: str | None = None, timeout: float | None = None) -> Batch:
        """Oldest item under `key`; LinkTimeoutError after `timeout` s (None: wait forever)."""
        try:
            item = self._queue(key).get(timeout=timeout)
        except queue.Empty:
            raise LinkTimeoutError(
                f"expected an item under key {key!r} within {timeout} s; none arrived"
            ) from None
        if item is None:
            raise LinkClosedError(f"link closed while waiting under key {key!r}")
        return item

    def close(self) -> None:
        """Fail current and future waiters (used when the peer thread raised)."""
        with self._lock:
            self._closed = True
            queues = list(self._queues.values())
        for q in queues:
            q.put(None)
