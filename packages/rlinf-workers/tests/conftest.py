"""Shared fixtures: the runtime the tests' worker groups run on, and tiny models.

`cluster` runs groups as the user's run on one machine does: ranks forked from one local
server, no Ray (`rlinf.workers.runtime.local`). With ``RLINF_TEST_RAY=1`` they run on one
local Ray instance shared by the session instead (starting Ray costs ~2 s and ~400 MB, each
actor 115-300 MB more; ranks get fractional CPUs so several small groups fit). Tests of
Ray itself start their own.
"""

from __future__ import annotations

import os
import signal
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

os.environ.setdefault("RAY_AUTH_MODE", "disabled")
os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")

# The Ctrl-C tests need Python's KeyboardInterrupt handler, which Python does not install
# when it starts with SIGINT ignored (a suite run as a shell's background job, `cmd &`).
if signal.getsignal(signal.SIGINT) is signal.SIG_IGN:
    signal.signal(signal.SIGINT, signal.default_int_handler)


def pytest_collection_finish(session: pytest.Session) -> None:
    """Ship the tests' own modules (their workers, toys and helpers) to local ranks by value,
    as each registers itself with Ray's cloudpickle: under pytest's importlib mode they are
    named after their path (``packages.rlinf-workers.tests...``), which a rank imports only
    while the checkout's root is on its path (``python -m pytest``, not ``pytest``)."""
    import cloudpickle

    here = Path(__file__).resolve().parent
    for module in list(sys.modules.values()):
        path = getattr(module, "__file__", None)
        if path and Path(path).resolve().is_relative_to(here):
            cloudpickle.register_pickle_by_value(module)


ON_RAY = os.environ.get("RLINF_TEST_RAY") == "1"
"""Whether `cluster` runs the tests' groups on a shared Ray instance (else: local ranks)."""


@pytest.fixture(scope="session")
def cluster() -> Iterator[str]:
    """The backend the tests' groups run on: "local", or "ray" with ``RLINF_TEST_RAY=1``."""
    import ray

    from rlinf.workers.runtime.ray_session import stop_ray

    if not ON_RAY:
        # A test of Ray that left it connected would move every later group onto it.
        assert not ray.is_initialized(), "a test left this process connected to Ray"
        yield "local"
        return
    if ray.is_initialized():
        yield "ray"
        return
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False,
             configure_logging=False)
    try:
        yield "ray"
    finally:
        stop_ray()  # ray.shutdown() without its second on the monitor


@pytest.fixture
def ray_instance(cluster: str) -> Iterator[None]:
    """Ray for a test of Ray's own behaviour (its nodes, its control store): the shared
    instance with ``RLINF_TEST_RAY=1``, else one of its own, stopped after it."""
    import ray

    from rlinf.workers.runtime.ray_session import stop_ray

    if cluster == "ray":
        yield
        return
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False,
             configure_logging=False)
    try:
        yield
    finally:
        stop_ray()


# -- tiny LLM fixtures shared by the actor, inference, reward, rollout and weight-sync tests --
# Imported lazily so tests that need no language model do not pay for transformers.


def _small_lm_config():  # type: ignore[no-untyped-def]
    from rlinf.workers.models import TinyLMConfig

    return TinyLMConfig(hidden_size=64, num_layers=2, num_heads=4, num_kv_heads=2,
                        intermediate_size=128, attn_implementation="eager")


@pytest.fixture(scope="session")
def tokenizer():  # type: ignore[no-untyped-def]
    from rlinf.workers.models import build_char_tokenizer

    return build_char_tokenizer()


@pytest.fixture
def model(tokenizer):  # type: ignore[no-untyped-def]
    """A fresh tiny model per test (tests train and overwrite it)."""
    from rlinf.workers.models import build_tiny_causal_lm

    return build_tiny_causal_lm(_small_lm_config(), seed=0, tokenizer=tokenizer)


@pytest.fixture(scope="session")
def problems():  # type: ignore[no-untyped-def]
    from rlinf.envs.math import ProblemGenerator

    return ProblemGenerator().generate(6)
