"""A Ray instance shared by the CLI runs of the app's tests.

Starting and stopping Ray costs ~7 s of a CLI run on the shared 2-core machine, so runs whose
tests do not depend on owning Ray connect (``RAY_ADDRESS``) to one local instance per test
session. It is owned by a helper process, not by the pytest process, so tests that
`ray.init` in-process (test_flow.py) are unaffected; closing the helper's stdin shuts it
down. Tests that kill a run's process tree or stop Ray under it start their own.
`ray_local` is Ray in the pytest process, per module, for tests that launch flows
in-process (`ReasoningFlow.launch`).

The instance declares 8 CPUs on a 2-core machine, as a user's ``ray start --num-cpus=8``
would: ``placement=auto`` runs on it too, and check that discovery counts the machine's
cores rather than Ray's CPUs (it did not: the profile probed 8 slots and never finished).
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import pytest

from rlinf.workers.runtime.ray_session import local_ray_instance


@pytest.fixture(scope="session", autouse=True)
def profile_cache(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    """The profile cache of every run of the session (``RLINF_PROFILE_CACHE``, which the
    config's default reads and CLI subprocesses inherit): never the user's own, and shared
    by the runs of the session as a user's runs share theirs. Tests that need an empty
    cache pass their own ``run.profile_cache``."""
    cache = tmp_path_factory.mktemp("profile-cache")
    previous = os.environ.get("RLINF_PROFILE_CACHE")
    os.environ["RLINF_PROFILE_CACHE"] = str(cache)
    yield cache
    if previous is None:
        os.environ.pop("RLINF_PROFILE_CACHE", None)
    else:
        os.environ["RLINF_PROFILE_CACHE"] = previous


@pytest.fixture(scope="session")
def ray_address() -> Iterator[str]:
    """The GCS address of a Ray instance that lives as long as the test session."""
    env = {**os.environ, "RAY_AUTH_MODE": "disabled", "RAY_USAGE_STATS_ENABLED": "0"}
    with local_ray_instance(env=env, shutdown_timeout=60) as address:
        yield address


@pytest.fixture(scope="module")
def ray_local() -> Iterator[None]:
    """Ray started in this process for the module's in-process flows (2 CPUs), stopped
    after it."""
    import ray

    from rlinf.workers.runtime.ray_session import stop_ray

    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False, configure_logging=False)
    try:
        yield
    finally:
        stop_ray()  # ray.shutdown() without its second on the monitor
