"""Shared fixtures: one local Ray instance for every test that needs one.

Starting Ray costs ~2 s and ~400 MB, each actor 115-300 MB more: tests share this session
fixture (`ray_cluster`) and give ranks fractional CPUs so several small groups fit.
"""

from __future__ import annotations

import os
from collections.abc import Iterator

import pytest

os.environ.setdefault("RAY_AUTH_MODE", "disabled")
os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")


@pytest.fixture(scope="session")
def ray_cluster() -> Iterator[None]:
    import ray

    if ray.is_initialized():
        yield
        return
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False,
             configure_logging=False)
    try:
        yield
    finally:
        ray.shutdown()
