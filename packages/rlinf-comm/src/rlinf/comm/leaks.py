"""Whether rlinf.comm left shared memory behind: for tests and teardown checks.

Every segment rlinf.comm creates is a file ``/dev/shm/rlinf-<hex>``. A segment that no live
process maps or holds open after a run is a leak; one that some process still maps belongs
to a run still going (another program using rlinf.comm on the machine, say).
"""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path

from rlinf.comm._internal.shm import SEGMENT_PREFIX

__all__ = ["live_segments", "orphaned_segments"]

_SHM_DIR = Path("/dev/shm")


def live_segments() -> set[str]:
    """Names of the rlinf.comm segments that exist now."""
    return {p.name for p in _SHM_DIR.glob(f"{SEGMENT_PREFIX}*")}


def orphaned_segments(before: Iterable[str] = ()) -> set[str]:
    """Segments that exist now, did not exist in `before`, and no process maps: leaked."""
    new = live_segments() - set(before)
    for maps in Path("/proc").glob("[0-9]*/maps"):
        if not new:
            break
        try:
            text = maps.read_text()
        except OSError:  # the process ended
            continue
        new = {name for name in new if name not in text}
    return new
