"""POSIX shared-memory segments: a reusing pool for creators, a mapping cache for readers.

Names are ``rlinf-`` plus 32 random hex digits (128 bits: unguessable), created with
``O_CREAT | O_EXCL`` and mode 0600, so only the same user can open them and no name is
ever taken over. We call ``_posixshmem`` and ``mmap`` directly instead of
``multiprocessing.shared_memory``: its resource tracker would unlink segments that a
reader merely attached to.

Ownership:
- A `SegmentPool` (one per process, `default_pool()`) creates segments, hands them out
  with `acquire` and takes them back with `release`. Reuse is the point: a warm segment
  is already backed by pages on both sides, so writing a 64 MiB batch again costs a
  memcpy, not 16k page faults. Free segments beyond ``max_free_bytes`` are unlinked.
- A `SegmentReader` (one per process, `default_reader()`) maps segments by name and
  keeps the mapping for the next message on the same segment. `open_view` returns a
  memoryview; when the last object referring to it dies, ``on_release`` fires.

Lifecycle: before a segment is created its name goes to this process's guardian (see
`guardian.py`), which unlinks whatever is left when this process dies, even by SIGKILL.
Clean exits unlink at `close()` / atexit, and a `Segment` object collected without
`unlink` (a ring or a pool dropped unclosed) takes its name with it: otherwise a
long-lived process would keep unmapped names in ``/dev/shm`` until it exits.
"""

from __future__ import annotations

import atexit
import contextlib
import mmap
import os
import re
import secrets
import select
import subprocess
import sys
import threading
import weakref
from collections import OrderedDict, deque
from collections.abc import Callable
from pathlib import Path
from typing import IO

import numpy as np

from rlinf.comm._internal.logs import get_logger
from rlinf.comm.errors import TransportError

__all__ = [
    "SEGMENT_PREFIX",
    "Segment",
    "SegmentPool",
    "SegmentReader",
    "default_pool",
    "default_reader",
    "new_segment_name",
    "valid_segment_name",
]

log = get_logger(__name__)

SEGMENT_PREFIX = "rlinf-"
_NAME_RE = re.compile(r"rlinf-[0-9a-f]{24,64}")
_SHM_DIR = Path("/dev/shm")
_MIN_SEGMENT = 1 << 20


def new_segment_name() -> str:
    """A fresh unguessable segment name."""
    return SEGMENT_PREFIX + secrets.token_hex(16)


def valid_segment_name(name: object) -> bool:
    """True for names this module could have created (guards every open/unlink)."""
    return isinstance(name, str) and _NAME_RE.fullmatch(name) is not None


def _shm_open(name: str, flags: int, mode: int) -> int:
    import _posixshmem

    return int(_posixshmem.shm_open("/" + name, flags, mode=mode))


def _shm_unlink(name: str) -> None:
    import _posixshmem

    with contextlib.suppress(FileNotFoundError):
        _posixshmem.shm_unlink("/" + name)


class _Guardian:
    """Pipe to this process's guardian child; started on first use.

    Keeps the names it was told about, so a guardian that died (someone killed it) is
    replaced by one that learns every live name again; gives up after a few restarts. A
    watcher thread notices the death at once (the pipe's write end reports an error when
    its reader is gone), so the replacement does not wait for this process's next
    allocation: killing the guardian and then its creator leaks nothing.
    """

    _MAX_STARTS = 3
    _WATCH_POLL_MS = 1000
    """How often the watcher re-checks which pipe is current (it wakes at once on a death)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._proc: subprocess.Popen[bytes] | None = None
        self._pid = -1
        self._live: set[str] = set()
        self._starts = 0
        self._guardian_pid: int | None = None
        self._watcher_pid = -1
        self._forgotten: deque[str] = deque()

    def _pipe(self) -> IO[bytes] | None:
        if self._pid != os.getpid():
            # New process (first use, or a forked child): the parent's guardian keeps
            # watching the parent's names; this process gets its own.
            self._proc, self._pid, self._live, self._starts = None, os.getpid(), set(), 0
        if self._proc is None:
            if self._starts >= self._MAX_STARTS:
                return None
            self._starts += 1
            script = Path(__file__).with_name("guardian.py")
            try:
                # The guardian detaches (see guardian.py): the process started here exits
                # at once after printing the guardian's pid; the guardian keeps the pipe.
                self._proc = subprocess.Popen(
                    [sys.executable, "-I", str(script)], stdin=subprocess.PIPE,
                    stdout=subprocess.PIPE, start_new_session=True)
                with self._proc.stdout or open(os.devnull, "rb") as out:
                    line = out.readline()
                self._proc.wait()
                self._guardian_pid = int(line)
            except (OSError, ValueError) as exc:
                log.warning("shm_guardian_unavailable", error=str(exc))
                self._proc = None
                return None
            if self._proc.stdin is not None and self._live:
                self._proc.stdin.write(b"".join(b"+%s\n" % n.encode() for n in self._live))
            if self._watcher_pid != os.getpid():
                self._watcher_pid = os.getpid()
                threading.Thread(target=self._watch, name="rlinf-shm-guardian-watch",
                                 daemon=True).start()
        return self._proc.stdin

    def _watch(self) -> None:
        """Replace the guardian as soon as its pipe breaks (it was killed)."""
        while True:
            with self._lock:
                proc = self._proc
                if self._pid != os.getpid() or proc is None or proc.stdin is None:
                    self._watcher_pid = -1  # the next start watches again
                    return
                fd = proc.stdin.fileno()
            poller = select.poll()
            poller.register(fd, 0)  # POLLERR and POLLHUP are always reported
            if not poller.poll(self._WATCH_POLL_MS):
                continue
            with self._lock:
                if self._proc is not proc:  # replaced meanwhile (by `tell`)
                    continue
                log.warning("shm_guardian_gone", error="its pipe broke",
                            restarts_left=self._MAX_STARTS - self._starts)
                self._retire(proc)
                replacement = self._pipe()
                if replacement is not None:
                    with contextlib.suppress(BrokenPipeError, ValueError):
                        replacement.flush()

    def _retire(self, proc: subprocess.Popen[bytes]) -> None:
        self._proc = None
        if proc.stdin is not None:
            with contextlib.suppress(OSError, ValueError):
                proc.stdin.close()

    def forget_later(self, name: str) -> None:
        """Queue ``-name`` for the next `tell`: safe from a GC callback, which may run while
        this thread holds the lock."""
        self._forgotten.append(name)

    def _take_forgotten(self) -> list[str]:
        """The names `forget_later` queued (none in a forked child: they are the parent's),
        no longer live. Call with the lock held."""
        taken = []
        while self._forgotten:
            taken.append(self._forgotten.popleft())
        if self._pid != os.getpid():
            return []
        self._live.difference_update(taken)
        return taken

    def tell(self, line: str) -> None:
        with self._lock:
            forgotten = self._take_forgotten()
            pipe = self._pipe()
            name = line[1:]
            if line.startswith("+"):
                self._live.add(name)
            else:
                self._live.discard(name)
            if pipe is None:
                return
            try:
                pipe.write(b"".join(b"-%s\n" % n.encode() for n in forgotten)
                           + line.encode() + b"\n")
                pipe.flush()
            except (BrokenPipeError, ValueError) as exc:
                log.warning("shm_guardian_gone", error=str(exc), restarts_left=(
                    self._MAX_STARTS - self._starts))
                if self._proc is not None:
                    self._retire(self._proc)
                # A replacement learns every live name (this one included) as it starts.
                replacement = self._pipe()
                if replacement is not None:
                    with contextlib.suppress(BrokenPipeError, ValueError):
                        replacement.flush()

    @property
    def pid(self) -> int | None:
        return self._guardian_pid if self._proc is not None else None


_guardian = _Guardian()


def _unlink_dropped(name: str, creator: int) -> None:
    """A `Segment` was collected without `unlink`: its name goes with it (its creator is
    still alive, so the guardian would keep it, unmapped, until the process exits)."""
    if os.getpid() != creator:  # a forked child's copy: the parent owns the name
        return
    _shm_unlink(name)
    _guardian.forget_later(name)


class Segment:
    """One shared-memory segment created (and owned) by this process. Its name lives until
    `unlink`, or until the object is collected: nothing can reach the contents then."""

    def __init__(self, size: int, *, name: str | None = None) -> None:
        self.name = name or new_segment_name()
        self.size = size
        _guardian.tell("+" + self.name)  # before creating: a crash right after is covered
        fd = _shm_open(self.name, os.O_CREAT | os.O_EXCL | os.O_RDWR, 0o600)
        try:
            os.ftruncate(fd, size)
            self._mmap = mmap.mmap(fd, size)
        except BaseException:
            _shm_unlink(self.name)
            raise
        finally:
            os.close(fd)
        self.view = memoryview(self._mmap)
        self.unlinked = False
        self._dropped = weakref.finalize(self, _unlink_dropped, self.name, os.getpid())

    def unlink(self, *, unmap: bool = True) -> None:
        """Remove the name; mappings (ours and readers') stay valid until unmapped, ours
        at once unless `unmap` is False (then when this object is collected)."""
        if self.unlinked:
            if unmap:
                self._unmap()
            return
        self.unlinked = True
        self._dropped.detach()
        _shm_unlink(self.name)
        _guardian.tell("-" + self.name)
        if unmap:
            self._unmap()

    def _unmap(self) -> None:
        with contextlib.suppress(BufferError):  # views still exported: GC unmaps later
            self.view.release()
            self._mmap.close()

    def __repr__(self) -> str:
        return f"Segment({self.name}, {self.size} bytes)"


_live_pools: weakref.WeakSet[SegmentPool] = weakref.WeakSet()


def _size_class(nbytes: int) -> int:
    size = max(nbytes, _MIN_SEGMENT)
    return 1 << (size - 1).bit_length()


class SegmentPool:
    """Creates, lends and reuses segments. Thread-safe.

    Capacities are powers of two (tmpfs only backs pages that are written, so the
    rounding costs address space, not memory). `acquire` prefers the most recently
    released segment of the size class: its pages are the warmest.
    """

    def __init__(self, *, max_free_bytes: int = 1 << 30) -> None:
        self.max_free_bytes = max_free_bytes
        self._lock = threading.Lock()
        self._free: OrderedDict[str, Segment] = OrderedDict()
        self._busy: dict[str, Segment] = {}
        self._closed = False
        self.created = 0  # segments created so far (tests and stats)
        self.pid = os.getpid()  # a forked child must never unlink its parent's segments
        _live_pools.add(self)

    def acquire(self, nbytes: int) -> Segment:
        """A segment of at least `nbytes`, lent to the caller until `release`."""
        size = _size_class(nbytes)
        with self._lock:
            if self._closed:
                raise TransportError("expected an open segment pool, got a closed one")
            for name in reversed(self._free):
                if self._free[name].size == size:
                    seg = self._free.pop(name)
                    self._busy[name] = seg
                    return seg
        seg = Segment(size)
        with self._lock:
            self._busy[seg.name] = seg
            self.created += 1
        log.debug("shm_segment_created", name=seg.name, size=size)
        return seg

    def get(self, name: str) -> Segment | None:
        """The segment called `name` if this pool owns it (busy or free)."""
        with self._lock:
            return self._busy.get(name) or self._free.get(name)

    def release(self, name: str) -> None:
        """Take a lent segment back for reuse (readers are done with its contents)."""
        evicted: list[Segment] = []
        with self._lock:
            seg = self._busy.pop(name, None)
            if seg is None:
                raise TransportError(f"expected a segment lent by this pool, got {name!r}")
            if self._closed:
                evicted.append(seg)
            else:
                self._free[name] = seg
                free = sum(s.size for s in self._free.values())
                while free > self.max_free_bytes and self._free:
                    _, old = self._free.popitem(last=False)
                    free -= old.size
                    evicted.append(old)
        for seg in evicted:
            seg.unlink()

    def discard(self, name: str) -> None:
        """Take a lent segment back and unlink it instead of reusing it: someone may still
        read it (their mapping stays valid; nothing of ours will write to it again)."""
        with self._lock:
            seg = self._busy.pop(name, None)
        if seg is None:
            raise TransportError(f"expected a segment lent by this pool, got {name!r}")
        seg.unlink()

    @property
    def free_bytes(self) -> int:
        with self._lock:
            return sum(s.size for s in self._free.values())

    def names(self) -> list[str]:
        with self._lock:
            return [*self._busy, *self._free]

    def close(self) -> None:
        """Unlink every segment; readers' existing mappings stay valid."""
        with self._lock:
            self._closed = True
            segments = [*self._busy.values(), *self._free.values()]
            self._busy.clear()
            self._free.clear()
        for seg in segments:
            seg.unlink()


class SegmentReader:
    """Maps segments by name and caches the mappings. Thread-safe.

    Never unlinks: the creator owns the name. A cached mapping of a segment whose name
    is gone is dropped at the next new mapping, so stale mappings do not pin memory.
    """

    def __init__(self, *, max_mappings: int = 256) -> None:
        self.max_mappings = max_mappings
        self._lock = threading.Lock()
        self._maps: OrderedDict[str, mmap.mmap] = OrderedDict()

    def _mapping(self, name: str) -> mmap.mmap:
        """The cached mapping of `name`, mapped now if needed. Call with the lock held."""
        found = self._maps.get(name)
        if found is not None:
            self._maps.move_to_end(name)
            return found
        try:
            fd = _shm_open(name, os.O_RDWR, 0)
        except FileNotFoundError as exc:
            raise TransportError(f"expected shared-memory segment {name!r} to exist, but it "
                                 "is gone (its creator released it or died)") from exc
        try:
            mapping = mmap.mmap(fd, os.fstat(fd).st_size)
        finally:
            os.close(fd)
        self._maps[name] = mapping
        self._drop_stale(keep=name)
        return mapping

    def _drop_stale(self, *, keep: str) -> None:
        for name in list(self._maps):
            if name == keep:
                continue
            if len(self._maps) > self.max_mappings or not (_SHM_DIR / name).exists():
                mapping = self._maps.pop(name)
                with contextlib.suppress(BufferError):  # in use: unmapped when views die
                    mapping.close()

    def open_view(self, name: str, offset: int, length: int, *,
                  on_release: Callable[[], None] | None = None) -> memoryview:
        """A writable view of `length` bytes at `offset` of segment `name`.

        The view (and everything built on it) references the mapping; when the last
        reference dies, `on_release` runs — in whichever thread drops it, so it must be
        quick and must not block (hand work to a queue).
        """
        if not valid_segment_name(name):
            raise TransportError(f"expected a segment name like 'rlinf-<hex>', got {name!r}")
        # Under the lock from lookup to view: once the view exists the mapping cannot be
        # closed by another thread's eviction (mmap.close refuses while views exist).
        with self._lock:
            mapping = self._mapping(name)
            if offset < 0 or length < 0 or offset + length > len(mapping):
                raise TransportError(f"expected [{offset}, {offset + length}) inside segment "
                                     f"{name!r} of {len(mapping)} bytes")
            # The finalizer must sit on the object every derived buffer keeps alive. A
            # memoryview is the wrong anchor: `np.frombuffer(view)` re-exports from the
            # mmap and lets `view` die while the arrays live, so the release would fire
            # early and the owner would reuse the segment under live arrays. An ndarray
            # exporter is kept alive by everything built on it (numpy views, memoryviews,
            # pyarrow and torch buffers).
            anchor = np.frombuffer(memoryview(mapping)[offset:offset + length], dtype=np.uint8)
        if on_release is not None:
            weakref.finalize(anchor, on_release)
        return anchor.data  # a memoryview exported by `anchor`, which it keeps alive

    def close(self) -> None:
        with self._lock:
            maps = list(self._maps.values())
            self._maps.clear()
        for mapping in maps:
            with contextlib.suppress(BufferError):
                mapping.close()


class _Defaults:
    """This process's pool and reader, recreated in a forked child."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.pid = -1
        self.pool: SegmentPool | None = None
        self.reader: SegmentReader | None = None

    def check_pid(self) -> None:
        if self.pid != os.getpid():
            # A forked child shares nothing it may free: start afresh.
            self.pool, self.reader, self.pid = None, None, os.getpid()


_defaults = _Defaults()


def default_pool() -> SegmentPool:
    """This process's segment pool (closed at exit)."""
    with _defaults.lock:
        _defaults.check_pid()
        if _defaults.pool is None:
            _defaults.pool = SegmentPool()
        return _defaults.pool


def default_reader() -> SegmentReader:
    """This process's mapping cache."""
    with _defaults.lock:
        _defaults.check_pid()
        if _defaults.reader is None:
            _defaults.reader = SegmentReader()
        return _defaults.reader


@atexit.register
def _close_at_exit() -> None:
    # Every pool of this process, not only the default one (the guardian would unlink
    # them too, but a clean exit should not leave that to another process).
    for pool in list(_live_pools):
        if pool.pid == os.getpid():
            pool.close()
