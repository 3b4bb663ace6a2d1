"""`ShmRing`: a one-way queue of byte payloads in shared-memory slots between two processes
of one node, with futex wake-ups.

For latency-bound exchanges (an env worker and its policy trading one small batch per step)
a framed socket message costs tens of microseconds on each side; here a put is a memcpy into
the next slot plus a counter store and a futex wake, and a get an optional spin, a futex
wait, then a memcpy out.

Layout of the segment: a header page, then `slots` slots of `slot_bytes` bytes, each an
8-byte length and the payload. The header holds two 32-bit counters in their own cache
lines, ``written`` (items published; the consumer sleeps on it) and ``read`` (items taken;
a producer facing a full ring sleeps on it), an ``attached``, a ``closed`` and a
``doorbell`` flag, and the consumer's process stamp. Counters wrap at 2**32; slot ``i``
holds item ``i % slots``.

A consumer that sleeps on something else (a poll over sockets) reads in place instead
(`peek`, `advance`) and asks for a *doorbell* while it sleeps (`ask_doorbell`): the
producer, after publishing (`try_put`), sees the flag (`doorbell_asked`) and rings it its
own way. Each side's store is followed by a futex wake, a full memory barrier in the kernel
(``futex_wake`` checks for waiters after ``smp_mb``), before it reads the other's word, so
at least one of them sees the other's store: the consumer finds the item before it sleeps,
or the producer rings.

One producer process creates the ring (`create`) and hands `offer()` to one consumer
process (over any channel) that `attach`es. The producer unlinks the segment's name as
soon as the consumer has mapped it, so a crash of either side afterwards leaves no name in
``/dev/shm``; before that the producer's guardian covers a SIGKILL (`shm.Segment`).

A waiting side checks the other's process stamp (`locality.stamped_process_gone`) every
`_CHECK_S`, so a peer that died surfaces as `PeerDiedError` naming it, not as a timeout.
Ordering: payload bytes are written before the counter that publishes them, and x86's
stores are not reordered; on other architectures the futex system call of every wake
orders them (spinning is off there).
"""

from __future__ import annotations

import contextlib
import ctypes
import json
import mmap
import os
import platform
import time
from collections.abc import Sequence
from typing import Any, TypeAlias

from rlinf.comm._internal import futex
from rlinf.comm._internal.locality import process_stamp, stamped_process_gone
from rlinf.comm._internal.shm import Segment, _shm_open, valid_segment_name
from rlinf.comm._internal.store import check_timeout
from rlinf.comm.errors import (
    ChannelClosedError,
    CodecError,
    CommError,
    CommTimeoutError,
    PeerDiedError,
)

__all__ = ["RingClosedError", "ShmRing"]

Buffer: TypeAlias = bytes | bytearray | memoryview

_HEADER = 4096
_WRITTEN, _READ, _ATTACHED, _CLOSED, _DOORBELL = 0, 64, 128, 192, 256
_CONSUMER_STAMP, _STAMP_BYTES = 512, 1024
_LENGTH = 8
_CHECK_S = 0.05
"""Longest sleep between checks of the peer's liveness and the closed flag."""
SPIN_ENV = "RLINF_COMM_RING_SPIN_US"
"""Environment variable: microseconds a waiting side polls before it sleeps (x86-64 only:
see the module docstring on ordering). Default 0: on a loaded 2-core machine a spin made the
env <-> policy round trip slower, and a longer spin slower still
(`benchmarks/bench_link.py --spin-us 0 20 100`); where a core is free per side, try it."""


def _default_spin_s() -> float:
    if platform.machine().lower() not in ("x86_64", "amd64"):
        return 0.0
    try:
        return max(float(os.environ.get(SPIN_ENV, "0")), 0.0) * 1e-6
    except ValueError:
        return 0.0


_POLL_S = 50e-6
"""Sleep between polls where futexes are unavailable."""


class RingClosedError(ChannelClosedError):
    """The other side closed the ring (and, for a consumer, nothing is left to take)."""


def bytes_view(part: Any) -> memoryview:
    """`part` as flat bytes (an empty one as an empty view: a shape with zeros won't cast)."""
    view = memoryview(part)
    if view.nbytes == 0:
        return memoryview(b"")
    return view if view.ndim == 1 and view.format == "B" else view.cast("B")


class ShmRing:
    """One end of a ring (module docstring): the producer's (`create`) or the consumer's
    (`attach`)."""

    def __init__(self, mapping: mmap.mmap, *, segment: Segment | None, name: str, slots: int,
                 slot_bytes: int, peer: str, peer_stamp: Any, spin_s: float | None) -> None:
        self.name = name
        self.slots = slots
        self.slot_bytes = slot_bytes
        self.peer = peer
        self._mapping = mapping
        self._segment = segment
        self._peer_stamp = peer_stamp
        self._spin_s = _default_spin_s() if spin_s is None else spin_s
        self._view = memoryview(mapping)
        self._words = self._view[:_HEADER].cast("I")  # aligned 32-bit loads and stores
        self._base = ctypes.addressof(ctypes.c_char.from_buffer(mapping))
        self._count = 0  # this side's own counter: items put (producer) or taken (consumer)
        self._closed = False

    # -- construction ------------------------------------------------------------------

    @classmethod
    def create(cls, *, slots: int = 16, slot_bytes: int = 1 << 16, peer: str = "consumer",
               spin_s: float | None = None) -> ShmRing:
        """The producer's end of a new ring of `slots` slots of `slot_bytes` bytes each."""
        if slots < 1 or slot_bytes < 64 or slot_bytes % 64:
            raise CommError(f"expected slots >= 1 and slot_bytes a multiple of 64 (>= 64), got "
                            f"{slots} and {slot_bytes}")
        segment = Segment(_HEADER + slots * slot_bytes)
        return cls(segment._mmap, segment=segment, name=segment.name, slots=slots,
                   slot_bytes=slot_bytes, peer=peer, peer_stamp=None, spin_s=spin_s)

    def offer(self) -> dict[str, Any]:
        """What the consumer needs to `attach` (JSON-safe)."""
        return {"segment": self.name, "slots": self.slots, "slot_bytes": self.slot_bytes,
                "producer": process_stamp()}

    @classmethod
    def attach(cls, offer: dict[str, Any], *, peer: str = "producer",
               spin_s: float | None = None) -> ShmRing:
        """The consumer's end of the ring `offer` describes (from the producer's `offer()`)."""
        name, slots, slot_bytes = offer.get("segment"), offer.get("slots"), offer.get("slot_bytes")
        if not valid_segment_name(name) or not isinstance(slots, int) or not isinstance(
                slot_bytes, int):
            raise CommError(f"expected a ring offer from ShmRing.offer(), got {offer!r}")
        try:
            fd = _shm_open(str(name), os.O_RDWR, 0o600)
        except OSError as exc:
            raise PeerDiedError(f"ring {name} of {peer!r} is gone before it was attached "
                                f"({exc}); its producer died or closed it") from exc
        try:
            size = _HEADER + slots * slot_bytes
            if slots < 1 or slot_bytes < 64 or os.fstat(fd).st_size != size:
                raise CommError(f"ring {name}: the offer's {slots} slots of {slot_bytes} bytes "
                                f"do not match the segment's {os.fstat(fd).st_size} bytes")
            mapping = mmap.mmap(fd, size)
        finally:
            os.close(fd)
        ring = cls(mapping, segment=None, name=str(name), slots=slots, slot_bytes=slot_bytes,
                   peer=peer, peer_stamp=offer.get("producer"), spin_s=spin_s)
        stamp = json.dumps(process_stamp()).encode()[:_STAMP_BYTES]
        mapping[_CONSUMER_STAMP:_CONSUMER_STAMP + len(stamp)] = stamp
        ring._store(_ATTACHED, 1)
        ring._wake(_ATTACHED)
        return ring

    # -- counters ------------------------------------------------------------------------

    def _load(self, offset: int) -> int:
        return self._words[offset >> 2]

    def _store(self, offset: int, value: int) -> None:
        self._words[offset >> 2] = value & 0xFFFFFFFF

    def _wake(self, offset: int) -> None:
        if futex.available():
            futex.wake(self._base + offset)

    def _consumer_stamp(self) -> Any:
        raw = bytes(self._mapping[_CONSUMER_STAMP:_CONSUMER_STAMP + _STAMP_BYTES]).rstrip(b"\0")
        try:
            return json.loads(raw) if raw else None
        except ValueError:
            return None

    def _await_change(self, offset: int, seen: int, timeout: float | None, doing: str) -> None:
        """Return once the counter at `offset` differs from `seen`; raise if the peer died,
        the ring was closed or `timeout` passed."""
        # A NaN deadline never passes: validated and clamped as every rlinf.comm wait.
        timeout = None if timeout is None else check_timeout(timeout)
        if self._spin_s > 0:
            spin_until = time.perf_counter() + self._spin_s
            while time.perf_counter() < spin_until:
                if self._load(offset) != seen:
                    return
        deadline = None if timeout is None else time.monotonic() + timeout
        slept = False
        while self._load(offset) == seen:
            if self._load(_CLOSED):
                raise RingClosedError(f"ring {self.name}: {self.peer!r} closed it while this "
                                      f"side waited to {doing}")
            if slept:  # a full slice passed: is the peer still there? (reads /proc)
                stamp = self._peer_stamp if self._segment is None else self._consumer_stamp()
                if stamped_process_gone(stamp):
                    raise PeerDiedError(f"{self.peer!r} (pid {stamp.get('pid')}) died while "
                                        f"this side waited to {doing} on ring {self.name}")
            slept = True
            left = _CHECK_S if deadline is None else min(_CHECK_S, deadline - time.monotonic())
            if left <= 0:
                raise CommTimeoutError(f"ring {self.name}: could not {doing} within {timeout} "
                                       f"s; {self.peer!r} is stuck or slow")
            if futex.available():
                futex.wait(self._base + offset, seen, left)
            else:
                time.sleep(min(left, _POLL_S))

    # -- the queue -----------------------------------------------------------------------

    @property
    def capacity(self) -> int:
        """Largest payload one slot holds, in bytes."""
        return self.slot_bytes - _LENGTH

    def put(self, payload: Buffer | Sequence[Buffer], *, timeout: float | None) -> None:
        """Copy `payload` (one buffer, or parts written back to back) into the next slot,
        waiting while the ring is full (producer)."""
        deadline = None if timeout is None else time.monotonic() + check_timeout(timeout)
        while not self.try_put(payload):
            read = self._load(_READ)
            if (self._count - read) & 0xFFFFFFFF >= self.slots:  # still full: sleep on it
                left = None if deadline is None else max(deadline - time.monotonic(), 0.0)
                self._await_change(_READ, read, left, "put (the ring is full)")

    def try_put(self, payload: Buffer | Sequence[Buffer]) -> bool:
        """`put` without waiting: False (nothing written) while the ring is full."""
        if self._segment is None:
            raise CommError(f"ring {self.name}: put on the consumer's end")
        self._check_open()
        parts = [payload] if isinstance(payload, (bytes, bytearray, memoryview)) else payload
        views = [bytes_view(part) for part in parts]
        size = sum(view.nbytes for view in views)
        if size > self.capacity:
            raise CommError(f"ring {self.name}: a {size}-byte payload exceeds the slot "
                            f"capacity of {self.capacity} bytes")
        if (self._count - self._load(_READ)) & 0xFFFFFFFF >= self.slots:
            return False
        start = _HEADER + (self._count % self.slots) * self.slot_bytes
        self._view[start:start + _LENGTH] = size.to_bytes(_LENGTH, "little")
        at = start + _LENGTH
        for view in views:
            self._view[at:at + view.nbytes] = view
            at += view.nbytes
        self._count = (self._count + 1) & 0xFFFFFFFF
        self._store(_WRITTEN, self._count)
        self._wake(_WRITTEN)  # also the barrier before a `doorbell_asked` (module docstring)
        if not self._segment.unlinked and self._load(_ATTACHED):
            self._segment.unlink(unmap=False)  # both sides mapped it: no name needed now
        return True

    @property
    def peer_closed(self) -> bool:
        """Whether either side closed the ring."""
        return bool(self._load(_CLOSED))

    @property
    def doorbell_asked(self) -> bool:
        """Whether the consumer sleeps elsewhere and wants to hear of a put (producer; read
        after `try_put`)."""
        return bool(self._load(_DOORBELL))

    def get(self, *, timeout: float | None) -> bytearray:
        """A copy of the next payload (writable), waiting while the ring is empty
        (consumer)."""
        if self._segment is not None:
            raise CommError(f"ring {self.name}: get on the producer's end")
        self._check_open()
        if self._load(_WRITTEN) == self._count:
            self._await_change(_WRITTEN, self._count, timeout, "get")
        start = _HEADER + (self._count % self.slots) * self.slot_bytes
        size = int.from_bytes(self._view[start:start + _LENGTH], "little")
        payload = bytearray(self._view[start + _LENGTH:start + _LENGTH + size])
        self._count = (self._count + 1) & 0xFFFFFFFF
        self._store(_READ, self._count)
        self._wake(_READ)
        return payload

    def peek(self) -> memoryview | None:
        """The next payload in place, or None while the ring is empty (consumer; valid
        until `advance`)."""
        if self._load(_WRITTEN) == self._count:
            return None
        start = _HEADER + (self._count % self.slots) * self.slot_bytes
        size = int.from_bytes(self._view[start:start + _LENGTH], "little")
        if size > self.capacity:  # only a corrupt producer writes this
            raise CodecError(f"ring {self.name}: a slot claims {size} bytes, more than its "
                            f"capacity of {self.capacity}")
        return self._view[start + _LENGTH:start + _LENGTH + size]

    def advance(self) -> None:
        """Done with the payload `peek` gave: its slot is the producer's again."""
        full = (self._load(_WRITTEN) - self._count) & 0xFFFFFFFF >= self.slots
        self._count = (self._count + 1) & 0xFFFFFFFF
        self._store(_READ, self._count)
        if full:  # a producer may sleep on it in `put`
            self._wake(_READ)

    def ask_doorbell(self, on: bool) -> None:
        """Ask the producer to ring after its puts (`on`: before this side sleeps
        elsewhere; look at the ring once more afterwards) or stop asking (consumer)."""
        self._store(_DOORBELL, int(on))
        if on:
            self._wake(_DOORBELL)  # the barrier before that last look (module docstring)

    def pending(self) -> int:
        """Items published and not yet taken."""
        return (self._load(_WRITTEN) - self._load(_READ)) & 0xFFFFFFFF

    def _check_open(self) -> None:
        if self._closed:
            raise CommError(f"ring {self.name} is closed on this side")

    def close(self) -> None:
        """Tell the peer (a waiting consumer still takes what was put), unlink, unmap."""
        if self._closed:
            return
        self._closed = True
        self._store(_CLOSED, 1)
        self._wake(_WRITTEN)
        self._wake(_READ)
        # The mapping lives until this object is collected (its views pin it): a thread
        # still waiting here keeps reading valid words and sees the closed flag.
        if self._segment is not None:
            self._segment.unlink()
        else:
            with contextlib.suppress(BufferError):  # views are held: the GC unmaps later
                self._mapping.close()

    def __enter__(self) -> ShmRing:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
