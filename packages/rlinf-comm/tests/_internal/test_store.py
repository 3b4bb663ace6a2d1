"""Tests of rlinf.comm._internal.store: the TCP key-value rendezvous."""

from __future__ import annotations

import subprocess
import sys
import threading
from collections.abc import Iterator

import pytest

from rlinf.comm._internal import wire
from rlinf.comm._internal.store import TCPStore, format_address, parse_address
from rlinf.comm.errors import AuthenticationError, CommTimeoutError, PeerDiedError


@pytest.fixture
def token() -> bytes:
    return wire.new_token()


@pytest.fixture
def store(token: bytes) -> Iterator[TCPStore]:
    with TCPStore.serve(token=token, timeout=10) as owner:
        assert isinstance(owner, TCPStore)
        yield owner


def test_set_get_add_compare_set_delete(store: TCPStore, token: bytes) -> None:
    other = TCPStore(store.address, token=token)
    try:
        store.set("a", b"1")
        assert other.get("a") == b"1"
        assert other.add("n", 5) == 5
        assert store.add("n") == 6
        assert store.get("n") == b"6"
        assert other.compare_set("x", None, b"first") == b"first"
        assert store.compare_set("x", None, b"second") == b"first"  # lost: key existed
        assert store.compare_set("x", b"first", b"third") == b"third"
        assert store.delete("x") is True
        assert store.delete("x") is False
        store.set("big", bytes(range(256)) * 4096)
        assert other.get("big") == bytes(range(256)) * 4096
    finally:
        other.close()


def test_get_waits_for_a_later_set(store: TCPStore, token: bytes) -> None:
    other = TCPStore(store.address, token=token)
    try:
        timer = threading.Timer(0.1, other.set, args=("late", b"v"))
        timer.start()
        assert store.get("late", timeout=10) == b"v"
        threading.Timer(0.1, other.set, args=("k2", b"")).start()
        other.set("k1", b"")
        store.wait(["k1", "k2"], timeout=10)
    finally:
        other.close()


def test_timeouts_raise_typed_errors_and_leave_the_store_usable(store: TCPStore) -> None:
    with pytest.raises(CommTimeoutError, match="missing"):
        store.get("never", timeout=0.2)
    with pytest.raises(TimeoutError):
        store.wait(["a", "never"], timeout=0.1)
    store.set("never", b"now")
    assert store.get("never", timeout=1) == b"now"


def test_bad_arguments_are_refused(store: TCPStore) -> None:
    with pytest.raises(TypeError, match="bytes"):
        store.set("k", "text")  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="sequence of keys"):
        store.wait("abc")
    with pytest.raises(ValueError, match="finite"):
        store.get("k", timeout=float("inf"))
    assert parse_address("10.0.0.1:80") == ("10.0.0.1", 80)
    assert format_address(("h", 1)) == "h:1"
    with pytest.raises(ValueError, match="host:port"):
        parse_address("nope")


def test_unauthenticated_clients_are_refused(store: TCPStore) -> None:
    with pytest.raises(AuthenticationError):
        TCPStore(store.address, token=wire.new_token())
    # The server survives refusing it.
    store.set("still", b"up")
    assert store.get("still") == b"up"


def test_clients_see_the_server_die(token: bytes) -> None:
    owner = TCPStore.serve(token=token)
    other = TCPStore(owner.address, token=token)
    owner.close()
    with pytest.raises(PeerDiedError):
        other.get("anything", timeout=5)
    other.close()


_CHILD = """
import sys
from rlinf.comm._internal.store import TCPStore
store = TCPStore(sys.argv[1], token=bytes.fromhex(sys.argv[2]))
value = store.get("question", timeout=30)
store.set("answer", value[::-1])
store.add("done")
store.close()
"""


def test_two_processes_rendezvous(store: TCPStore, token: bytes) -> None:
    child = subprocess.Popen(
        [sys.executable, "-c", _CHILD, format_address(store.address), token.hex()]
    )
    try:
        store.set("question", b"abc")
        assert store.get("answer", timeout=30) == b"cba"
        store.wait(["done"], timeout=30)
        assert child.wait(timeout=30) == 0
    finally:
        child.kill()
