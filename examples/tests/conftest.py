"""What the examples' tests share: the backend their runs use, and the check that a program
left nothing behind (no rank, no reserved CPU, no shared-memory segment).

The examples run as a user's program on one machine does, its ranks local processes without
Ray; with ``RLINF_TEST_RAY=1`` a module's runs share a local Ray instance instead."""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Iterator
from typing import TypeVar

import pytest

from rlinf.comm import live_segments, orphaned_segments

os.environ.setdefault("RAY_AUTH_MODE", "disabled")
os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")

T = TypeVar("T")


@pytest.fixture(scope="module")
def backend() -> Iterator[str]:
    """Where the module's runs put their ranks: "local", or with ``RLINF_TEST_RAY=1`` a
    2-CPU Ray instance ("ray")."""
    import ray

    if os.environ.get("RLINF_TEST_RAY") != "1":
        yield "local"
        return
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False, configure_logging=False)
    try:
        yield "ray"
    finally:
        ray.shutdown()


def eventually(check: Callable[[], bool], timeout: float = 30.0) -> bool:
    """Whether `check` holds within `timeout` seconds."""
    deadline = time.monotonic() + timeout
    while not check():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.1)
    return True


def live_ranks() -> list[str]:
    """Ranks still alive: Ray's named actors, or the local backend's processes (the fork
    server's, and what they started: `rlinf.workers.runtime.local.live_ranks`)."""
    from rlinf.workers.runtime import local
    from rlinf.workers.runtime.lazy_ray import connected, ray

    if connected():
        return [a["name"] for a in ray.util.list_named_actors(all_namespaces=True)]
    return local.live_ranks()


def leaving_nothing(program: Callable[[], T]) -> T:
    """`program()`'s result, after checking it left no rank, no reserved CPU (Ray returns a
    dead actor's CPUs a moment after it reports the death) and no orphaned shared-memory
    segment."""
    import ray

    before = live_segments()
    result = program()
    assert eventually(lambda: live_ranks() == []), live_ranks()
    if ray.is_initialized():
        assert eventually(lambda: ray.available_resources().get("CPU")
                          == ray.cluster_resources().get("CPU"))
    assert eventually(lambda: not orphaned_segments(before)), orphaned_segments(before)
    return result
