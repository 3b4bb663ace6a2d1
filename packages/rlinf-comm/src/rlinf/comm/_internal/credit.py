"""`CreditWord`: the room a channel's owner set aside for one producer, counted in shared
memory, so that granting it costs no message.

A producer whose puts go on credit (see `channel_server`) creates the word (one page of shared
memory) and offers it in its hello; an owner on the same node maps it, and from then on adds
to it whenever it reserves room for that producer, and wakes the producer (a futex) in case
it sleeps on the word waiting for room. The producer compares the count with what it spent
and gave back: a put that finds room spends it without asking anybody, and one that finds
none sleeps in the kernel until the owner grants more. An owner elsewhere cannot map the
word (another node's /dev/shm): that producer's credits then come in the owner's answers.

Only the owner writes the count; it wraps at 2**32 (both sides compare differences). The
producer keeps the number of its threads asleep on the word beside it, and the owner wakes
only when that is not 0: a grant to a producer that is busy costs no system call. (A sleeper
counted an instant too late for the owner to see sleeps out its first slice,
`WANT_AFTER_S`, and then asks.)
The producer unlinks the name once the owner answered its hello, so nothing is left in
/dev/shm either way (before that, its guardian covers a crash, as for every `Segment`).
"""

from __future__ import annotations

import contextlib
import ctypes
import mmap
import os
import threading
import time
from collections.abc import Callable
from typing import Any

from rlinf.comm._internal import futex
from rlinf.comm._internal.shm import Segment, _shm_open, valid_segment_name

__all__ = ["MASK", "WANT_AFTER_S", "CreditWord", "Credits"]

MASK = 0xFFFFFFFF
_SIZE = 4096
_SLEEPERS = 16  # the word (index in 32-bit words) in its own cache line


class CreditWord:
    """One side of a credit word: the producer's (`create`) or the owner's (`attach`)."""

    def __init__(self, mapping: mmap.mmap, *, segment: Segment | None, name: str) -> None:
        self.name = name
        self._mapping = mapping
        self._segment = segment
        self._words = memoryview(mapping)[:64 + 4].cast("I")  # the count; the sleepers
        self._address = ctypes.addressof(ctypes.c_char.from_buffer(mapping))

    @classmethod
    def create(cls) -> CreditWord | None:
        """A producer's new word (count 0), or None where futexes are unavailable."""
        if not futex.available():
            return None
        segment = Segment(_SIZE)
        return cls(segment._mmap, segment=segment, name=segment.name)

    def offer(self) -> dict[str, Any]:
        """What the owner needs to `attach` (JSON-safe)."""
        return {"segment": self.name}

    @classmethod
    def attach(cls, offer: Any) -> CreditWord | None:
        """The owner's side of the word `offer` names, or None when it cannot be mapped
        here (the producer runs on another node, or no futexes)."""
        name = offer.get("segment") if isinstance(offer, dict) else None
        if not valid_segment_name(name) or not futex.available():
            return None
        try:
            fd = _shm_open(str(name), os.O_RDWR, 0o600)
        except OSError:
            return None
        try:
            if os.fstat(fd).st_size != _SIZE:
                return None
            mapping = mmap.mmap(fd, _SIZE)
        finally:
            os.close(fd)
        return cls(mapping, segment=None, name=str(name))

    def unlink(self) -> None:
        """The producer drops the name once the owner mapped it (or could not)."""
        if self._segment is not None:
            self._segment.unlink(unmap=False)

    def load(self) -> int:
        return self._words[0]

    def add(self, n: int) -> None:
        """Grant `n` more (owner), waking the producer's threads that sleep on the word."""
        self._words[0] = (self._words[0] + n) & MASK
        if self._words[_SLEEPERS]:
            futex.wake(self._address)

    def set_sleepers(self, n: int) -> None:
        """How many of the producer's threads sleep on the word now (producer)."""
        self._words[_SLEEPERS] = n

    def wake(self) -> None:
        """Wake whoever sleeps on the word (to look at something else: a close, a death)."""
        futex.wake(self._address)

    def wait(self, seen: int, timeout: float) -> None:
        """Sleep while the count is still `seen`, at most `timeout` s (spurious returns
        allowed: the caller looks again)."""
        futex.wait(self._address, seen, timeout)

    def close(self) -> None:
        """Unmap (later, by the garbage collector, while views of it live)."""
        if self._segment is not None:
            self._segment.unlink(unmap=False)
        with contextlib.suppress(BufferError):
            self._mapping.close()


WANT_AFTER_S = 0.001
"""How long a producer waits on its word for room before it tells the owner (`want`): room
usually comes within microseconds as the consumer takes items; when it does not (others hold
the room), the owner asks them for it."""
_SLICE_S = 0.05
"""Longest sleep on the word between checks (the channel closed, the owner died)."""


class Credits:
    """A producer handle's room on credit (see `channel_server`): granted in the owner's
    answers (`add`) and, once one is attached, in a credit word; spent by its puts (`take`).
    Both kinds add up, as they do in the owner's count of what this handle holds. Thread-safe.
    """

    def __init__(self, *, bounded: bool) -> None:
        self.word: CreditWord | None = None
        self._bounded = bounded
        self._lock = threading.Lock()
        self._credits = 0  # granted in answers (or refunded), unspent
        # the word's count minus these two is what is unspent of it (mod 2**32)
        self._spent = 0
        self._returned = 0
        self._sleepers = 0  # threads asleep on the word (the owner wakes only for them)

    def attach(self, word: CreditWord) -> None:
        """The owner mapped `word`: its grants count from now on."""
        with self._lock:
            self.word = word

    def _from_word(self) -> int:
        if self.word is None:
            return 0
        return (self.word.load() - self._spent - self._returned) & MASK

    def take(self, n: int) -> bool:
        """Spend `n` if that much is unspent (always, on an unbounded channel)."""
        if not self._bounded:
            return True
        with self._lock:
            if self._credits >= n:
                self._credits -= n
                return True
            if self._credits + self._from_word() < n:
                return False
            self._spent += n - self._credits
            self._credits = 0
            return True

    def refund(self, n: int) -> None:
        """`n` taken were not used after all (nothing was sent)."""
        if self._bounded:
            with self._lock:
                self._credits += n

    def add(self, n: int) -> None:
        """A grant that came in an answer."""
        with self._lock:
            self._credits += n

    def give_back(self) -> int:
        """Give up everything unspent (the owner revoked it); returns how much."""
        with self._lock:
            from_word = self._from_word()
            self._returned += from_word
            unspent, self._credits = self._credits + from_word, 0
            return unspent

    def wait_for_one(self, deadline: float, *, check: Callable[[], None],
                     ask: Callable[[], None]) -> bool:
        """Take one credit, sleeping on the word until the owner grants one or `deadline`
        passes (False; at once without a word). `check` raises when waiting is pointless
        (closed, owner gone); `ask` tells the owner, once, after `WANT_AFTER_S` without
        room."""
        word = self.word
        if word is None:
            return False
        started = time.monotonic()
        asked = False
        while True:
            seen = word.load()
            if self.take(1):
                return True
            check()
            now = time.monotonic()
            if now >= deadline:
                return False
            if not asked and now - started >= WANT_AFTER_S:
                asked = True
                ask()
            pause = WANT_AFTER_S if not asked else _SLICE_S
            self._count_sleeper(word, 1)
            try:
                word.wait(seen, min(deadline - now, pause))
            finally:
                self._count_sleeper(word, -1)

    def _count_sleeper(self, word: CreditWord, change: int) -> None:
        with self._lock:
            self._sleepers += change
            word.set_sleepers(self._sleepers)

    def wake(self) -> None:
        """Wake a put sleeping on the word (to look at the channel's state again)."""
        if self.word is not None:
            self.word.wake()

    def close(self) -> None:
        if self.word is not None:
            self.word.close()
