"""Fixtures of the app's tests: the profile cache, and Ray where a test asks for it.

CLI runs start no Ray: their workers are processes of this machine, as a user's run on one
machine. With ``RLINF_TEST_RAY=1`` the runs that take `ray_address` connect
(``RAY_ADDRESS``) to one local Ray instance per test session instead, owned by a helper
process (closing its stdin shuts it down), so tests that `ray.init` in-process
(test_flow.py) are unaffected. Tests that stop Ray under a run start their own.
`ray_local` is Ray in the pytest process, per module, for tests that launch flows
in-process (`ReasoningFlow.launch`).

That instance declares 8 CPUs on a 2-core machine, as a user's ``ray start --num-cpus=8``
would, to check that discovery counts the machine's cores rather than Ray's CPUs.
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
    """The Ray instance the CLI runs connect to: none (``""``), so each run's workers are
    processes of this machine, as a user's run on one machine; with ``RLINF_TEST_RAY=1``
    the GCS address of one Ray instance that lives as long as the test session."""
    if os.environ.get("RLINF_TEST_RAY") != "1":
        yield ""
        return
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
