"""Same process: hand over the reference, copy nothing."""

from __future__ import annotations

import itertools
import os
import threading
from typing import Any, ClassVar

from rlinf.comm._internal.codec import Target
from rlinf.comm._internal.transports.base import Exported, OnRelease, ReleaseOnce, Transport
from rlinf.comm.batch import Batch
from rlinf.comm.errors import TransportError

__all__ = ["InProcessTransport"]


class InProcessTransport(Transport):
    """Keeps exported batches in a process-local registry until released.

    The receiver gets the very same `Batch` object (same arrays): sender and receiver
    share the memory, so neither may mutate arrays the other still reads.
    """

    name: ClassVar[str] = "inproc"

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._batches: dict[int, Batch] = {}
        self._ids = itertools.count()

    def export(self, batch: Batch, *, peer: str | None = None) -> Exported:
        batch = Batch.of(batch)
        key = next(self._ids)
        with self._lock:
            self._batches[key] = batch
        return Exported({"transport": self.name, "pid": os.getpid(), "key": key})

    def open(self, descriptor: dict[str, Any], buffers: list[memoryview], *,
             on_release: OnRelease | None = None, to: Target = "auto") -> Batch:
        self.check_descriptor(descriptor)
        if descriptor.get("pid") != os.getpid():
            raise TransportError(f"expected an in-process descriptor of pid {os.getpid()}, "
                                 f"got one of pid {descriptor.get('pid')}")
        with self._lock:
            batch = self._batches.get(int(descriptor["key"]))
        if batch is None:
            raise TransportError(f"expected exported batch {descriptor['key']} to be held, "
                                 "but it was released")
        # The receiver now holds its own references: the registry entry may go.
        ReleaseOnce(descriptor, on_release, count=0)
        return batch

    def release(self, descriptor: dict[str, Any]) -> None:
        self.check_descriptor(descriptor)
        with self._lock:
            self._batches.pop(int(descriptor["key"]), None)

    def close(self) -> None:
        with self._lock:
            self._batches.clear()

    @property
    def held(self) -> int:
        with self._lock:
            return len(self._batches)
