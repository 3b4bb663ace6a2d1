"""Shared fixtures: one local Ray instance for every test that needs one.

Starting Ray costs ~2 s and ~400 MB, each actor 115-300 MB more: tests share this session
fixture (`ray_cluster`) and give ranks fractional CPUs so several small groups fit.
"""

from __future__ import annotations

import os
import signal
from collections.abc import Iterator

import pytest

os.environ.setdefault("RAY_AUTH_MODE", "disabled")
os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")

# The Ctrl-C tests need Python's KeyboardInterrupt handler, which Python does not install
# when it starts with SIGINT ignored (a suite run as a shell's background job, `cmd &`).
if signal.getsignal(signal.SIGINT) is signal.SIG_IGN:
    signal.signal(signal.SIGINT, signal.default_int_handler)


@pytest.fixture(scope="session")
def ray_cluster() -> Iterator[None]:
    import ray

    from rlinf.workers.runtime.ray_session import stop_ray

    if ray.is_initialized():
        yield
        return
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False,
             configure_logging=False)
    try:
        yield
    finally:
        stop_ray()  # ray.shutdown() without its second on the monitor


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
