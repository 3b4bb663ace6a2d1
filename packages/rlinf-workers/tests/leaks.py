"""What the tests that launch processes check is gone afterwards, given a deadline (their
shared-memory check is `rlinf.comm.orphaned_segments`)."""

from __future__ import annotations

import time
from collections.abc import Callable

__all__ = ["eventually", "live_ranks"]


def eventually(check: Callable[[], bool], *, timeout: float = 30.0) -> bool:
    """Ray frees a killed actor's name and CPUs asynchronously, and a killed local rank is
    reaped a moment later: give it a deadline."""
    deadline = time.monotonic() + timeout
    while not check():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.1)
    return True


def live_ranks() -> list[str]:
    """The ranks of this process's groups still alive, whichever backend runs them: Ray's
    named actors, or the local backend's processes (`rlinf.workers.runtime.local.live_ranks`)."""
    from rlinf.workers.runtime import local
    from rlinf.workers.runtime.lazy_ray import connected, ray

    if connected():
        return [a["name"] for a in ray.util.list_named_actors(all_namespaces=True)]
    return local.live_ranks()
