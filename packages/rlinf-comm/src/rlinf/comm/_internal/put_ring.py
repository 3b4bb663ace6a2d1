"""A channel handle's puts to an owner on its node, through a shared-memory ring.

Over the handle's connection a small put costs a frame encoded, sent, polled for, read and
decoded: Python on each side, per message, that dwarfs the copy of a small item. A handle
whose owner mapped its ring (`RingWriter`, offered once with ``put_ring``) writes a small
inline item into the ring's next slot instead; the owner (`RingReader`) drains its clients'
rings into its queues whenever it handles anything (a frame, a local get, a stat) and
before a get of its sleeps.

Order: a handle's items keep their order whichever way they went. Each slot records how
many frames the handle had sent on its connection when it was written (``after``); the
owner takes a slot only once it has handled that many frames of the connection, and takes
the slots written before a frame before it handles the frame. An item that does not fit a
slot, or finds the ring full, goes over the connection: the ring never makes a put wait.

Doorbell: the owner asks for one (`ShmRing.ask_doorbell`) only while one of its gets is
parked; a producer that sees the ask after its put sends a one-way ``ring`` frame. See
`ring` for why neither side can miss the other.

Slot layout (little-endian): ``after`` u64, weight f64, meta length u32, buffer count u32,
the buffers' lengths (u64 each), the meta JSON ``{"k": key, "d": descriptor}``, then each
buffer at a 64-byte boundary of the payload. Nothing in a slot is trusted: lengths and
counts are checked against the slot before anything is read.
"""

from __future__ import annotations

import json
import struct
import threading
from typing import Any, NamedTuple

from rlinf.comm import errors
from rlinf.comm._internal import futex
from rlinf.comm._internal.ring import ShmRing, bytes_view

__all__ = ["RingItem", "RingReader", "RingWriter"]

SLOTS = 16
"""Slots per ring: a handle's items in flight before it falls back to its connection."""
HEAD_ROOM = 4096
"""Bytes per slot beyond the largest inline item, for its header (an item whose metadata
does not fit goes over the connection). Pages of the segment are only backed once written,
so a ring costs what its items use, not its size."""
_HEAD = struct.Struct("<QdII")
_ALIGN = 64
_MAX_BUFFERS = 1024
_ZEROS = bytes(_ALIGN)


def _align(n: int) -> int:
    return (n + _ALIGN - 1) // _ALIGN * _ALIGN


class RingItem(NamedTuple):
    key: str
    weight: float
    descriptor: Any
    buffers: list[memoryview]


class RingWriter:
    """The producer's end: `try_put` small inline items (thread-safe)."""

    def __init__(self, ring: ShmRing) -> None:
        self.ring = ring
        self._lock = threading.Lock()
        self._last: tuple[str, Any, bytes] | None = None  # a stream's items share their meta

    @classmethod
    def create(cls, item_bytes: int) -> RingWriter | None:
        """A new ring for items of up to `item_bytes` of arrays, or None where futexes are
        missing (the doorbell needs their barrier) or shared memory cannot be had."""
        if not futex.available():
            return None
        slot_bytes = (item_bytes + HEAD_ROOM + 4095) // 4096 * 4096
        try:
            return cls(ShmRing.create(slots=SLOTS, slot_bytes=slot_bytes, peer="channel owner"))
        except (OSError, errors.CommError):
            return None

    def offer(self) -> dict[str, Any]:
        return self.ring.offer()

    def try_put(self, after: int, key: str, weight: float, descriptor: Any,
                buffers: list[Any]) -> bool:
        """Write one item (False: it does not fit a slot, or the ring is full or closed;
        then nothing was written)."""
        views = [bytes_view(b) for b in buffers]
        last = self._last
        if last is not None and last[0] == key and last[1] == descriptor:
            meta = last[2]
        else:
            meta = json.dumps({"k": key, "d": descriptor}, separators=(",", ":")).encode()
            self._last = (key, descriptor, meta)
        head = (_HEAD.pack(after, weight, len(meta), len(views))
                + struct.pack(f"<{len(views)}Q", *[v.nbytes for v in views]) + meta)
        written = _align(len(head))
        parts: list[Any] = [head + _ZEROS[:written - len(head)]]
        for view in views:
            if written % _ALIGN:  # the previous buffer's padding
                parts.append(_ZEROS[:_align(written) - written])
                written = _align(written)
            parts.append(view)
            written += view.nbytes
        if written > self.ring.capacity:
            return False
        with self._lock:
            if self.ring.peer_closed:
                return False
            return self.ring.try_put(parts)

    @property
    def doorbell_asked(self) -> bool:
        return self.ring.doorbell_asked

    def close(self) -> None:
        self.ring.close()


class RingReader:
    """The owner's end of one client's ring (used under the owner's lock)."""

    def __init__(self, ring: ShmRing) -> None:
        self.ring = ring
        self.asked = False
        self._last: tuple[bytes, str, list[Any]] | None = None  # meta bytes, key, tensors

    @classmethod
    def attach(cls, offer: Any) -> RingReader | None:
        """Map the ring `offer` describes; None when it cannot be (another node, a bad
        offer: the handle then puts over its connection)."""
        if not futex.available() or not isinstance(offer, dict):
            return None
        try:
            return cls(ShmRing.attach(offer, peer="channel producer"))
        except (OSError, errors.CommError):
            return None

    def has_items(self) -> bool:
        return self.ring.pending() > 0

    def take(self, handled: int) -> list[RingItem]:
        """The items written after at most `handled` frames of the connection, in order.
        CodecError for a malformed slot (the producer is broken or hostile)."""
        out = []
        while (view := self.ring.peek()) is not None:
            if len(view) < _HEAD.size:
                raise errors.CodecError(f"ring slot of {len(view)} bytes: too short")
            after, weight, meta_len, nbuf = _HEAD.unpack_from(view)
            if after > handled:
                break
            out.append(self._decode(view, weight, meta_len, nbuf))
            self.ring.advance()
        return out

    def ask_doorbell(self, on: bool) -> None:
        if on != self.asked:
            self.asked = on
            self.ring.ask_doorbell(on)

    def close(self) -> None:
        self.ring.close()


    def _decode(self, view: memoryview, weight: float, meta_len: int, nbuf: int) -> RingItem:
        at = _HEAD.size
        if nbuf > _MAX_BUFFERS or at + 8 * nbuf + meta_len > len(view):
            raise errors.CodecError(f"ring slot of {len(view)} bytes: {nbuf} buffers and "
                                    f"{meta_len} bytes of meta do not fit")
        lengths = struct.unpack_from(f"<{nbuf}Q", view, at)
        at += 8 * nbuf
        raw = bytes(view[at:at + meta_len])
        key, descriptor = self._meta(raw)
        start = _align(at + meta_len)
        offsets, end = [], 0
        for n in lengths:
            offsets.append(_align(end))
            end = offsets[-1] + n
        if start + end > len(view):
            raise errors.CodecError(f"ring slot of {len(view)} bytes: buffers of {end} "
                                    f"bytes from {start} overrun it")
        # One copy out of the slot (which the producer reuses): the item's own bytes.
        block = memoryview(bytearray(view[start:start + end]))
        buffers = [block[off:off + n] for off, n in zip(offsets, lengths, strict=True)]
        return RingItem(key, float(weight), descriptor, buffers)

    def _meta(self, raw: bytes) -> tuple[str, Any]:
        """The key and descriptor in `raw`; a stream's items repeat them, so the last
        ones are kept (their tensor specs shared: only read; the batch's meta is each
        item's own)."""
        last = self._last
        if last is not None and last[0] == raw:
            return last[1], {"tensors": last[2], "meta": {}}
        try:
            meta = json.loads(raw)
        except ValueError as exc:
            raise errors.CodecError(f"ring slot: undecodable meta ({exc})") from exc
        if not isinstance(meta, dict) or not isinstance(meta.get("k"), str) or not isinstance(
                meta.get("d"), dict):
            raise errors.CodecError(f"ring slot: expected meta {{k, d}}, got {meta!r:.200}")
        descriptor = meta["d"]
        if descriptor.get("meta") == {} and isinstance(descriptor.get("tensors"), list):
            self._last = (raw, meta["k"], descriptor["tensors"])
        return meta["k"], descriptor
