"""Ray's asynchronous cleanup, given a deadline, for the tests that launch processes (their
shared-memory check is `rlinf.comm.orphaned_segments`)."""

from __future__ import annotations

import time
from collections.abc import Callable

__all__ = ["eventually"]


def eventually(check: Callable[[], bool], *, timeout: float = 30.0) -> bool:
    """Ray frees a killed actor's name and CPUs asynchronously: give it a deadline."""
    deadline = time.monotonic() + timeout
    while not check():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.1)
    return True
