"""Same node, host data: Arrow IPC in a pooled POSIX shared-memory segment."""

from __future__ import annotations

import os
import threading
from typing import Any, ClassVar

from rlinf.comm._internal import codec, shm
from rlinf.comm._internal.codec import Target
from rlinf.comm._internal.transports.base import (
    Exported,
    OnRelease,
    ReleaseOnce,
    Transport,
    host_copy,
)
from rlinf.comm.batch import Batch
from rlinf.comm.errors import TransportError

__all__ = ["SharedMemoryTransport"]


class SharedMemoryTransport(Transport):
    """Writes the batch once into a segment lent by the pool; the reader maps it.

    Memory: the segment belongs to the owner's pool; the receiver's arrays view it in
    place. When the receiver drops its last view, ``on_release`` fires; the owner's
    `release` returns the segment to the pool for the next batch (warm pages).
    """

    name: ClassVar[str] = "shm"

    def __init__(self, *, pool: shm.SegmentPool | None = None,
                 reader: shm.SegmentReader | None = None) -> None:
        self._pool = pool
        self._reader = reader
        self._lock = threading.Lock()
        self._lent: set[str] = set()

    @property
    def pool(self) -> shm.SegmentPool:
        return self._pool if self._pool is not None else shm.default_pool()

    @property
    def reader(self) -> shm.SegmentReader:
        return self._reader if self._reader is not None else shm.default_reader()

    def export(self, batch: Batch, *, peer: str | None = None) -> Exported:
        plan = codec.plan_encoding(host_copy(batch))
        segment = self.pool.acquire(plan.nbytes)
        try:
            plan.write_into(segment.view)
        except BaseException:
            self.pool.release(segment.name)
            raise
        with self._lock:
            self._lent.add(segment.name)
        return Exported({"transport": self.name, "name": segment.name, "offset": 0,
                         "nbytes": plan.nbytes, "pid": os.getpid()})

    def open(self, descriptor: dict[str, Any], buffers: list[memoryview], *,
             on_release: OnRelease | None = None, to: Target = "auto") -> Batch:
        self.check_descriptor(descriptor)
        release = ReleaseOnce(descriptor, on_release)
        view = self.reader.open_view(str(descriptor["name"]), int(descriptor["offset"]),
                                     int(descriptor["nbytes"]),
                                     on_release=release.part_released)
        return codec.decode(view, to=to)

    def release(self, descriptor: dict[str, Any]) -> None:
        self.pool.release(self._unlend(descriptor))

    def discard(self, descriptor: dict[str, Any]) -> None:
        # Unlinked, not pooled: the receiver's mapping stays valid, and no later export
        # of ours writes into it.
        self.pool.discard(self._unlend(descriptor))

    def _unlend(self, descriptor: dict[str, Any]) -> str:
        self.check_descriptor(descriptor)
        name = str(descriptor["name"])
        with self._lock:
            if name not in self._lent:
                raise TransportError(f"expected a segment this process exported, got {name!r}"
                                     " (released twice, or exported elsewhere)")
            self._lent.discard(name)
        return name

    def close(self) -> None:
        with self._lock:
            names, self._lent = list(self._lent), set()
        for name in names:
            self.pool.release(name)
