"""What the tests that launch processes check afterwards: no shared-memory segment leaked
(`rlinf.comm.orphaned_segments`), and Ray's asynchronous cleanup given a deadline."""

from __future__ import annotations

import time
from collections.abc import Callable

from rlinf.comm import live_segments as segments
from rlinf.comm import orphaned_segments as orphaned

__all__ = ["eventually", "orphaned", "segments"]


def eventually(check: Callable[[], bool], *, timeout: float = 30.0) -> bool:
    """Ray frees a killed actor's name and CPUs asynchronously: give it a deadline."""
    deadline = time.monotonic() + timeout
    while not check():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.1)
    return True
