"""Other node, host data: the Arrow IPC bytes travel inline in the message frame."""

from __future__ import annotations

from typing import Any, ClassVar

from rlinf.comm._internal import codec
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

__all__ = ["TcpTransport"]


class TcpTransport(Transport):
    """Encodes the batch once into a buffer that the connection sends with scatter I/O.

    GPU arrays are copied to host first (this transport carries bytes, not handles) and
    arrive as host arrays. The receiver's arrays are zero-copy views on the frame buffer
    that the connection received into; the owner keeps nothing after `export`.
    """

    name: ClassVar[str] = "tcp"
    needs_release: ClassVar[bool] = False

    def export(self, batch: Batch, *, peer: str | None = None) -> Exported:
        encoded = codec.encode(host_copy(batch))
        return Exported({"transport": self.name, "nbytes": encoded.size}, [encoded])

    def open(self, descriptor: dict[str, Any], buffers: list[memoryview], *,
             on_release: OnRelease | None = None, to: Target = "auto") -> Batch:
        self.check_descriptor(descriptor)
        if len(buffers) != 1 or memoryview(buffers[0]).nbytes != descriptor.get("nbytes"):
            sizes = [memoryview(b).nbytes for b in buffers]
            raise TransportError(f"expected one buffer of {descriptor.get('nbytes')} bytes, "
                                 f"got buffers of {sizes} bytes")
        batch = codec.decode(buffers[0], to=to)
        ReleaseOnce(descriptor, on_release, count=0)  # nothing of the owner's is held
        return batch
