"""Tests of rlinf.comm._internal.ray_store: the Store interface on a Ray actor."""

from __future__ import annotations

import os
import sys
import time
from collections.abc import Iterator

import pytest

from rlinf.comm._internal.ray_store import RayStore
from rlinf.comm.errors import CommError, CommTimeoutError, MissingExtraError

ray = pytest.importorskip("ray")


def test_missing_ray_names_the_extra(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "ray", None)  # makes `import ray` raise ImportError
    with pytest.raises(MissingExtraError, match=r"rlinf-comm\[ray\]"):
        RayStore("no-ray")


def test_ray_store_needs_ray_initialised() -> None:
    if ray.is_initialized():
        pytest.skip("a Ray session is active")
    with pytest.raises(CommError, match=r"ray\.init"):
        RayStore("no-session")


@pytest.fixture(scope="module")
def ray_session() -> Iterator[None]:
    os.environ.setdefault("RAY_AUTH_MODE", "disabled")
    os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
    ray.init(num_cpus=1, include_dashboard=False, log_to_driver=False)
    try:
        yield
    finally:
        ray.shutdown()


def test_ray_store_has_the_store_semantics(ray_session: None) -> None:
    store = RayStore("test-store", timeout=30)
    again = RayStore("test-store")  # same named actor
    store.set("a", b"1")
    assert again.get("a") == b"1"
    assert store.add("n", 2) == 2
    assert again.add("n") == 3
    assert store.compare_set("x", None, b"first") == b"first"
    assert again.compare_set("x", None, b"second") == b"first"
    assert store.delete("x") is True
    assert store.delete("x") is False
    with pytest.raises(CommTimeoutError):
        store.get("never", timeout=0.2)
    with pytest.raises(CommTimeoutError):
        store.wait(["a", "never"], timeout=0.2)
    store.wait(["a", "n"], timeout=5)


def test_destroy_kills_the_actor_for_every_client(ray_session: None) -> None:
    store = RayStore("test-destroyed", timeout=30)
    store.set("a", b"1")
    store.destroy()
    deadline = time.monotonic() + 30  # Ray frees the name once the kill has gone through
    while True:
        try:
            ray.get_actor("test-destroyed")
        except ValueError:
            break
        assert time.monotonic() < deadline, "the destroyed store's actor is still named"
        time.sleep(0.1)
    with pytest.raises(CommTimeoutError):  # a new actor by that name: nothing kept
        RayStore("test-destroyed").get("a", timeout=0.2)
