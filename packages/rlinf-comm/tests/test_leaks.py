"""rlinf.comm.leaks: a mapped segment is live, an unmapped new one is orphaned."""

from __future__ import annotations

import secrets
from pathlib import Path

from rlinf.comm import ShmRing, live_segments, orphaned_segments


def test_a_mapped_segment_is_live_and_not_orphaned_until_it_is_unmapped() -> None:
    before = live_segments()
    with ShmRing.create(slots=2, slot_bytes=64) as ring:
        assert ring.name in live_segments() - before
        assert ring.name not in orphaned_segments(before)  # this process maps it
    assert ring.name not in live_segments()  # closed: unlinked


def test_a_left_behind_segment_is_orphaned() -> None:
    before = live_segments()
    leaked = Path("/dev/shm") / f"rlinf-{secrets.token_hex(16)}"
    leaked.write_bytes(b"\0" * 64)
    try:
        assert orphaned_segments(before) == {leaked.name}
        assert orphaned_segments(live_segments()) == set()
    finally:
        leaked.unlink()
