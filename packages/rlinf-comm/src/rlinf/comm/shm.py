"""POSIX shared-memory segments: the public face of rlinf.comm's shared-memory layer.

For other packages that move their own bytes between processes of one node (weight sync in
rlinf.workers is one). Segments are named ``rlinf-`` + 32 random hex digits, mode 0600, and
unlinked when their creator exits — even by SIGKILL (a guardian process watches the names).

Memory:

- A `SegmentPool` creates the segments and owns them. `acquire(nbytes)` lends a `Segment`
  (``.name``, ``.size``, ``.view``: a writable memoryview of the whole segment) to the
  caller until `release(name)` hands it back for reuse, or `discard(name)` unlinks it
  instead (someone may still read it); `close()` unlinks every segment of the pool.
  Readers' existing mappings stay valid after an unlink.
- A `SegmentReader` owns nothing it maps: the creator owns the name. `open_view(name,
  offset, length, on_release=)` returns a writable memoryview; the mapping lives as long as
  any object built on that view, and ``on_release`` runs once the last one dies (in
  whichever thread drops it, so it must only enqueue). Tell the creator to `release` only
  after that.

Errors are `rlinf.comm.TransportError` (closed pool, unknown or vanished segment, a view out
of range).
"""

from rlinf.comm._internal.shm import Segment, SegmentPool, SegmentReader

__all__ = ["Segment", "SegmentPool", "SegmentReader"]
