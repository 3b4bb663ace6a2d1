"""What the examples' tests share: a local Ray instance per module, and the check that a
program left nothing behind (no Ray actor, every CPU free again, no shared-memory segment)."""

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
def ray_local() -> Iterator[None]:
    """A 2-CPU Ray instance for the module's runs."""
    import ray

    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False, configure_logging=False)
    try:
        yield
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


def leaving_nothing(program: Callable[[], T]) -> T:
    """`program()`'s result, after checking it left no named actor, no reserved CPU (Ray
    returns a dead actor's CPUs a moment after it reports the death) and no orphaned
    shared-memory segment."""
    import ray

    before = live_segments()
    result = program()
    assert ray.util.list_named_actors(all_namespaces=True) == []
    assert eventually(lambda: ray.available_resources().get("CPU")
                      == ray.cluster_resources().get("CPU"))
    assert eventually(lambda: not orphaned_segments(before)), orphaned_segments(before)
    return result
