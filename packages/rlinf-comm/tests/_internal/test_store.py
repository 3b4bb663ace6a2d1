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

from .deadlines import raises_timeout_within
from .procs import stop


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
        second = threading.Timer(0.1, other.set, args=("k2", b""))
        second.start()
        other.set("k1", b"")
        store.wait(["k1", "k2"], timeout=10)
        # The set is in before its reply reaches the timer; closing sooner fails the thread.
        timer.join(timeout=10)
        second.join(timeout=10)
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
        [sys.executable, "-c", _CHILD, store.address, token.hex()]
    )
    try:
        store.set("question", b"abc")
        assert store.get("answer", timeout=30) == b"cba"
        store.wait(["done"], timeout=30)
        assert child.wait(timeout=30) == 0
    finally:
        child.kill()


_STOPPABLE_SERVER = """
import sys, time
from rlinf.comm._internal.store import TCPStore
served = TCPStore.serve(token=bytes.fromhex(sys.argv[1]))
print(served.address, flush=True)
time.sleep(300)
"""


def test_every_call_returns_within_its_timeout_while_the_server_is_stopped(token: bytes) -> None:
    """Defect 3: with the store's server SIGSTOPped, every call (reads and writes) raises
    CommTimeoutError within its timeout plus 10% and 50 ms; once the server resumes, the
    client goes on (late answers are dropped)."""
    import os
    import signal

    server = subprocess.Popen([sys.executable, "-c", _STOPPABLE_SERVER, token.hex()],
                              stdout=subprocess.PIPE, text=True)
    try:
        assert server.stdout is not None
        client = TCPStore(server.stdout.readline().strip(), token=token, timeout=0.4)
        client.set("present", b"1")
        stop(server.pid)
        try:
            # Reads and the delete may repeat; the writes get one try each (the add is
            # counted below).
            raises_timeout_within(0.5, lambda: client.get("missing", timeout=0.5), attempts=3)
            raises_timeout_within(0.4, lambda: client.get("present"), attempts=3)  # default
            raises_timeout_within(0.3, lambda: client.wait(["missing"], timeout=0.3), attempts=3)
            raises_timeout_within(0.5, lambda: client.set("k", b"v", timeout=0.5))
            raises_timeout_within(0.5, lambda: client.add("n", timeout=0.5))
            raises_timeout_within(0.5, lambda: client.compare_set("k", None, b"w", timeout=0.5))
            raises_timeout_within(0, lambda: client.delete("k", timeout=0), attempts=3)
        finally:
            os.kill(server.pid, signal.SIGCONT)
        assert client.get("present", timeout=10) == b"1"
        assert client.add("n", timeout=10) == 2  # the stalled add went in when it resumed
        client.close()
    finally:
        server.kill()
        server.wait(timeout=10)
        if server.stdout is not None:
            server.stdout.close()
