"""The `Transport` interface: export a batch here, open it there, release it back.

A transport moves one `Batch` between two processes in three verbs:

- ``export(batch)`` (owner side) returns an `Exported`: a JSON-safe ``descriptor`` to send
  to the receiver, plus ``buffers`` to put in the same frame (the bytes themselves, for
  transports that carry data inline; empty for shared memory and CUDA IPC).
- ``open(descriptor, buffers, on_release=...)`` (receiver side) returns the `Batch`,
  zero-copy wherever the transport allows. ``on_release(descriptor)`` is called exactly
  once, when the receiver no longer needs anything the owner holds — right away for
  transports that copy, when the last view dies for shared memory and CUDA IPC. It
  may run in any thread (a garbage-collection callback): it must be quick and must not
  block.
- ``release(descriptor)`` (owner side) frees or recycles what `export` holds; call it
  once the receiver's ``on_release`` has reached the owner, or when the receiver died.
"""

from __future__ import annotations

import threading
from abc import ABC, abstractmethod
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, ClassVar

from rlinf.comm._internal.codec import Target
from rlinf.comm.batch import Batch, array_kind, is_device_array
from rlinf.comm.errors import TransportError

__all__ = ["Exported", "OnRelease", "ReleaseOnce", "Transport", "host_copy"]

OnRelease = Callable[[dict[str, Any]], None]


@dataclass(frozen=True)
class Exported:
    """What `Transport.export` produced: a JSON-safe descriptor plus inline buffers."""

    descriptor: dict[str, Any]
    buffers: list[Any] = field(default_factory=list)


class Transport(ABC):
    """One way of moving batches between processes. Instances are thread-safe."""

    name: ClassVar[str]
    needs_release: ClassVar[bool] = True
    """Whether the owner holds resources after `export` until `release` is called."""

    @abstractmethod
    def export(self, batch: Batch, *, peer: str | None = None) -> Exported:
        """Make `batch` available to a receiver. `peer` names it where a transport needs
        to know (NCCL); others ignore it. The owner keeps `batch` unchanged until release.
        """

    @abstractmethod
    def open(self, descriptor: dict[str, Any], buffers: list[memoryview], *,
             on_release: OnRelease | None = None, to: Target = "auto") -> Batch:
        """Materialise an exported batch on the receiving side."""

    def release(self, descriptor: dict[str, Any]) -> None:  # noqa: B027 - optional hook
        """Owner side: the receiver is done (or dead); free what `export` holds."""

    def discard(self, descriptor: dict[str, Any]) -> None:
        """Owner side, when the owner leaves while a receiver may still read the payload:
        free what `export` holds without recycling it under the receiver's views. The
        default is `release` (right for transports whose receiver holds its own copy or
        reference)."""
        self.release(descriptor)

    def close(self) -> None:  # noqa: B027 - optional hook
        """Free everything this transport holds in this process."""

    def check_descriptor(self, descriptor: dict[str, Any]) -> None:
        if not isinstance(descriptor, dict) or descriptor.get("transport") != self.name:
            got = descriptor.get("transport") if isinstance(descriptor, dict) else descriptor
            raise TransportError(f"expected a {self.name!r} descriptor, got {got!r}")

    def __repr__(self) -> str:
        return f"{type(self).__name__}()"


class ReleaseOnce:
    """Calls ``on_release(descriptor)`` once, after `count` parts were each let go."""

    def __init__(self, descriptor: dict[str, Any], on_release: OnRelease | None,
                 count: int = 1) -> None:
        self._descriptor = descriptor
        self._on_release = on_release
        self._left = count
        self._lock = threading.Lock()
        if count <= 0:
            self._fire()

    def part_released(self) -> None:
        with self._lock:
            self._left -= 1
            done = self._left == 0
        if done:
            self._fire()

    def _fire(self) -> None:
        callback, self._on_release = self._on_release, None
        if callback is not None:
            callback(self._descriptor)


def host_copy(batch: Batch | Mapping[str, Any]) -> Batch:
    """`batch` with every GPU array copied to host memory (host arrays untouched)."""
    batch = Batch.of(batch)
    if not batch.on_device:
        return batch
    tensors = {}
    for name, array in batch.tensors.items():
        if not is_device_array(array):
            tensors[name] = array
        elif array_kind(array) == "torch":
            tensors[name] = array.detach().cpu()
        else:
            tensors[name] = array.get()
    return Batch(tensors, batch.meta)
