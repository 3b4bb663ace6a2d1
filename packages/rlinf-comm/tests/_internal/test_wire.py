"""Tests of rlinf.comm._internal.wire: framing, authentication, timeouts, peer death."""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import pytest

from rlinf.comm._internal import wire
from rlinf.comm.errors import (
    AuthenticationError,
    CodecError,
    CommTimeoutError,
    PeerDiedError,
)


@pytest.fixture
def token() -> bytes:
    return wire.new_token()


@pytest.fixture
def pair(token: bytes) -> Iterator[tuple[wire.Connection, wire.Connection]]:
    with wire.Listener(token=token) as listener, ThreadPoolExecutor(1) as pool:
        accepted = pool.submit(listener.accept, timeout=10)
        client = wire.connect(listener.address, token=token, timeout=10)
        server = accepted.result(timeout=10)
        try:
            yield client, server
        finally:
            client.close()
            server.close()


def test_frame_round_trip_with_large_and_empty_buffers(pair):
    client, server = pair
    big = np.random.default_rng(0).integers(0, 255, size=24 << 20, dtype=np.uint8)
    small = b"hello"
    header = {"kind": "batch", "n": [1, 2, 3], "nested": {"a": None}}
    with ThreadPoolExecutor(1) as pool:
        # Send in a thread: 24 MiB exceeds the socket buffers, so send and recv overlap.
        fut = pool.submit(client.send, header, [small, big, b"", bytearray(3)], timeout=30)
        got_header, bufs = server.recv(timeout=30)
        fut.result(timeout=30)
    assert got_header == header
    assert [len(b) for b in bufs] == [5, big.nbytes, 0, 3]
    assert bytes(bufs[0]) == small
    assert np.array_equal(np.frombuffer(bufs[1], dtype=np.uint8), big)
    # Caller owns writable, 64-byte aligned buffers (Arrow decodes zero-copy from them).
    assert not bufs[1].readonly
    assert np.frombuffer(bufs[1], dtype=np.uint8).ctypes.data % 64 == 0


def test_non_byte_buffers_are_sent_as_raw_bytes(pair):
    client, server = pair
    arr = np.arange(12, dtype=np.float64).reshape(3, 4)
    client.send({}, [arr, memoryview(arr)], timeout=10)
    _, bufs = server.recv(timeout=10)
    assert np.array_equal(np.frombuffer(bufs[0]).reshape(3, 4), arr)
    assert bytes(bufs[1]) == arr.tobytes()


def test_strided_buffer_is_refused(pair):
    client, _ = pair
    with pytest.raises(CodecError, match="C-contiguous"):
        client.send({}, [np.arange(10)[::2]], timeout=10)


def test_header_must_be_a_json_dict(pair):
    client, _ = pair
    with pytest.raises(CodecError):
        client.send({"x": object()}, timeout=10)  # type: ignore[dict-item]
    with pytest.raises(CodecError):
        client.send([1, 2], timeout=10)  # type: ignore[arg-type]


def test_concurrent_sends_do_not_interleave(pair):
    client, server = pair
    n = 40
    payloads = [bytes([i]) * (100_000 + i) for i in range(n)]
    with ThreadPoolExecutor(4) as pool:
        futs = [pool.submit(client.send, {"i": i}, [payloads[i]], timeout=30)
                for i in range(n)]
        seen = set()
        for _ in range(n):
            header, bufs = server.recv(timeout=30)
            assert bytes(bufs[0]) == payloads[header["i"]]
            seen.add(header["i"])
        for f in futs:
            f.result(timeout=30)
    assert seen == set(range(n))


def test_recv_timeout_before_any_byte_keeps_connection_usable(pair):
    client, server = pair
    with pytest.raises(CommTimeoutError):
        server.recv(timeout=0.05)
    assert not server.closed
    client.send({"after": True}, timeout=10)
    assert server.recv(timeout=10)[0] == {"after": True}


def test_try_recv_returns_none_until_a_frame_starts_then_reads_it_whole(pair):
    client, server = pair
    assert server.try_recv(timeout=10) is None and not server.closed
    client.send({"n": 1}, [b"payload"], timeout=10)
    frame = None
    deadline = time.monotonic() + 10
    while frame is None and time.monotonic() < deadline:
        frame = server.try_recv(timeout=10)
    assert frame is not None
    header, buffers = frame
    assert header == {"n": 1} and bytes(buffers[0]) == b"payload"


def test_a_connection_over_a_unix_socket_names_its_peer() -> None:
    a, b = socket.socketpair()
    left, right = wire.Connection(a), wire.Connection(b)
    assert left.peer_address[0].startswith("unix:") and left.peer_address[1] == 0
    left.send({"x": 1}, timeout=10)
    assert right.recv(timeout=10)[0] == {"x": 1}
    left.close()
    right.close()


def test_send_timeout_when_peer_does_not_read_closes_connection(pair):
    client, _ = pair
    big = bytes(64 << 20)  # far beyond loopback socket buffers
    with pytest.raises(CommTimeoutError):
        client.send({}, [big], timeout=0.2)
    # The frame went out half-way, so the stream cannot be reused.
    assert client.closed
    with pytest.raises(PeerDiedError):
        client.send({}, timeout=1)


def test_peer_close_raises_peer_died(pair):
    client, server = pair
    client.close()
    with pytest.raises(PeerDiedError):
        server.recv(timeout=10)


def test_local_close_wakes_a_blocked_recv(pair):
    _, server = pair
    errors: list[BaseException] = []

    def receive() -> None:
        try:
            server.recv(timeout=30)
        except BaseException as exc:
            errors.append(exc)

    thread = threading.Thread(target=receive)
    thread.start()
    server.close()
    thread.join(timeout=10)
    assert not thread.is_alive()
    assert len(errors) == 1
    assert isinstance(errors[0], PeerDiedError | OSError)


_KILLED_CLIENT = """
import os, signal, sys
from rlinf.comm._internal import wire
conn = wire.connect(("127.0.0.1", int(sys.argv[1])), token=bytes.fromhex(sys.argv[2]),
                    timeout=10)
# Start a frame that promises 1 MiB, send a part of it, then die without closing.
import struct
conn._sock.setblocking(True)
conn._sock.sendall(struct.pack("!4sII", b"RLF1", 2, 1) + struct.pack("!Q", 1 << 20) + b"{}")
conn._sock.sendall(b"x" * 1000)
print("ready", flush=True)
os.kill(os.getpid(), signal.SIGKILL)
"""


def test_sigkilled_peer_mid_frame_raises_peer_died(token):
    with wire.Listener(token=token) as listener:
        proc = subprocess.Popen(
            [sys.executable, "-c", _KILLED_CLIENT, str(listener.address[1]), token.hex()],
            stdout=subprocess.PIPE)
        try:
            conn = listener.accept(timeout=30)
            with pytest.raises(PeerDiedError, match="after 1000 of"):
                conn.recv(timeout=30)
            assert conn.closed
        finally:
            proc.wait(timeout=30)
    assert proc.returncode == -signal.SIGKILL


def test_wrong_token_is_refused_on_both_sides(token):
    with wire.Listener(token=token) as listener:
        with pytest.raises(AuthenticationError):
            wire.connect(listener.address, token=wire.new_token(), timeout=10)
        # the listener refused it (closed before sending its proof) and hands out nothing
        assert listener.refused == 1
        with pytest.raises(CommTimeoutError):
            listener.accept(timeout=0.2)


def test_garbage_client_is_refused_and_nothing_is_decoded(token, monkeypatch):
    decoded: list[bytes] = []

    class _SpyJson:
        @staticmethod
        def loads(data: bytes) -> object:
            decoded.append(bytes(data))
            raise AssertionError("a frame header was decoded")

        dumps = staticmethod(wire.json.dumps)

    monkeypatch.setattr(wire, "json", _SpyJson)
    with wire.Listener(token=token) as listener:
        raw = socket.create_connection(listener.address, timeout=10)
        # Looks like a legitimate frame, but the handshake comes first: refused.
        frame = b"RLF1" + (2).to_bytes(4, "big") + (0).to_bytes(4, "big") + b"{}"
        raw.sendall(frame * 20)
        with pytest.raises(CommTimeoutError):
            listener.accept(timeout=0.5)
        # The listener closed its end (EOF, or a reset since our bytes stay unread).
        raw.settimeout(10)
        with pytest.raises(ConnectionResetError):
            while raw.recv(4096):
                pass
            raise ConnectionResetError("eof")
        raw.close()
    assert decoded == []


def test_client_refuses_a_server_that_is_not_rlinf(token):
    server = socket.create_server(("127.0.0.1", 0))
    port = server.getsockname()[1]

    def serve() -> None:
        conn, _ = server.accept()
        conn.sendall(b"HTTP/1.1 400 Bad Request\r\n\r\n" + b" " * 64)
        with contextlib.suppress(OSError):  # the client hangs up on us: fine
            conn.recv(1024)
        conn.close()

    thread = threading.Thread(target=serve)
    thread.start()
    try:
        with pytest.raises(AuthenticationError, match="greeting"):
            wire.connect(("127.0.0.1", port), token=token, timeout=10)
    finally:
        thread.join(timeout=10)
        server.close()


def test_accept_times_out(token):
    with wire.Listener(token=token) as listener, pytest.raises(CommTimeoutError):
        listener.accept(timeout=0.05)


def test_connect_to_nobody_raises_peer_died(token):
    sock = socket.create_server(("127.0.0.1", 0))
    port = sock.getsockname()[1]
    sock.close()
    with pytest.raises(PeerDiedError):
        wire.connect(f"127.0.0.1:{port}", token=token, timeout=5)


def test_default_token_from_env(monkeypatch):
    tok = wire.new_token()
    monkeypatch.setenv(wire.TOKEN_ENV, tok.hex())
    assert wire.default_token() == tok
    monkeypatch.setenv(wire.TOKEN_ENV, "not hex")
    with pytest.raises(AuthenticationError, match="hex"):
        wire.default_token()
    monkeypatch.delenv(wire.TOKEN_ENV)
    with pytest.raises(AuthenticationError, match=wire.TOKEN_ENV):
        wire.default_token()


def test_short_tokens_are_rejected():
    with pytest.raises(AuthenticationError, match="at least"):
        wire.Listener(token=b"short")
    assert len(wire.new_token()) == 32
    assert os.environ.get("NONEXISTENT_RLINF") is None


def test_arbitrary_frames_round_trip(pair):
    from hypothesis import HealthCheck, given, settings
    from hypothesis import strategies as st

    client, server = pair
    json_leaf = st.none() | st.booleans() | st.integers(-(2**53), 2**53) | st.text(max_size=20)
    headers = st.dictionaries(st.text(max_size=10),
                              st.recursive(json_leaf, lambda inner: st.lists(inner, max_size=3),
                                           max_leaves=5), max_size=5)
    buffers = st.lists(st.binary(max_size=3000), max_size=8)

    @settings(max_examples=60, deadline=None, suppress_health_check=list(HealthCheck))
    @given(header=headers, bufs=buffers)
    def check(header, bufs):
        client.send(header, bufs, timeout=10)
        got_header, got = server.recv(timeout=10)
        assert got_header == header
        assert [bytes(b) for b in got] == bufs

    check()


def test_silent_client_cannot_hold_accept(token):
    with wire.Listener(token=token, handshake_timeout=0.2) as listener:
        silent = socket.create_connection(listener.address, timeout=10)
        try:
            with pytest.raises(CommTimeoutError):
                listener.accept(timeout=1.0)  # the silent client is never handed out
            assert listener.refused == 1  # closed after its 0.2 s handshake budget
            silent.settimeout(10)
            assert silent.recv(64)  # the greeting, then EOF: the listener hung up
        finally:
            silent.close()


def _assert_a_client_is_served_within_2_s(listener: wire.Listener, pool: ThreadPoolExecutor,
                                          token: bytes) -> None:
    """A legitimate client connects, is accepted and exchanges a message within 2 s."""
    started = time.monotonic()
    client = pool.submit(wire.connect, listener.address, token=token, timeout=5)
    with listener.accept(timeout=5) as server_end, client.result(timeout=5) as ours:
        ours.send({"hello": 1}, timeout=5)
        assert server_end.recv(timeout=5)[0] == {"hello": 1}
    assert time.monotonic() - started < 2.0


def test_idle_unauthenticated_connections_delay_no_legitimate_client(token):
    """Regression: the handshake ran in the accepting thread with a 10 s budget per
    connection, so four idle TCP connections (no token needed) locked a legitimate client
    out for 30 s and more."""
    with wire.Listener(token=token) as listener, ThreadPoolExecutor(1) as pool:
        idle = [socket.create_connection(listener.address, timeout=10) for _ in range(8)]
        try:
            _assert_a_client_is_served_within_2_s(listener, pool, token)
        finally:
            for sock in idle:
                sock.close()


def _recv_all(sock: socket.socket) -> bytes:
    sock.settimeout(10)
    data = b""
    while chunk := sock.recv(4096):
        data += chunk
    return data


def test_a_full_handshake_table_evicts_its_oldest_idle_client(token):
    with wire.Listener(token=token, max_pending=2) as listener:
        idle = [socket.create_connection(listener.address, timeout=10) for _ in range(2)]
        time.sleep(0.2)  # both are pending, in this order
        idle.append(socket.create_connection(listener.address, timeout=10))
        try:
            assert _recv_all(idle[0])  # the greeting, then EOF: evicted for the newcomer
            assert listener.refused == 1
            idle[2].settimeout(0.5)
            assert idle[2].recv(64)  # the newcomer got its greeting and stays open
            idle[1].settimeout(0.5)
            assert idle[1].recv(64)  # the greeting ...
            with pytest.raises(TimeoutError):
                idle[1].recv(64)  # ... and no EOF: the younger idle client is still pending
        finally:
            for sock in idle:
                sock.close()


def test_idle_connections_filling_the_handshake_table_lock_no_legitimate_client_out(token):
    """Regression (#13, D1): once `max_pending` unauthenticated connections were open, every
    new client was closed at once, legitimate ones included, until the idle ones timed out
    (10 s by default) or went away."""
    with wire.Listener(token=token, max_pending=8) as listener, ThreadPoolExecutor(1) as pool:
        idle = [socket.create_connection(listener.address, timeout=10) for _ in range(8)]
        try:
            time.sleep(0.2)  # the table is full
            _assert_a_client_is_served_within_2_s(listener, pool, token)
            assert listener.refused == 1  # the oldest idle connection made room
        finally:
            for sock in idle:
                sock.close()


def test_accept_refuses_a_bad_timeout(token):
    with wire.Listener(token=token) as listener:
        for bad in (float("nan"), -1.0, float("inf")):
            with pytest.raises(ValueError, match="timeout"):
                listener.accept(timeout=bad)


def test_a_declared_header_length_allocates_nothing_before_its_bytes_arrive(pair):
    """Defect 7c: a peer holding the token declared a 64 MiB header and sent a few bytes;
    the receiver allocated (and zero-filled) all 64 MiB up front, per connection."""
    import struct
    import tracemalloc

    client, server = pair
    declared = (64 << 20) - 1
    tracemalloc.start()
    try:
        tracemalloc.reset_peak()
        before = tracemalloc.get_traced_memory()[0]
        with ThreadPoolExecutor(1) as pool:
            pending = pool.submit(server.recv, timeout=30)
            client._sock.setblocking(True)
            client._sock.sendall(struct.pack("!4sII", b"RLF1", declared, 0) + b"{" * 1000)
            client.close()  # the rest never comes
            with pytest.raises(PeerDiedError, match="1000 of"):
                pending.result(timeout=30)
        peak = tracemalloc.get_traced_memory()[1] - before
    finally:
        tracemalloc.stop()
    assert peak < 4 << 20, f"receiving 1000 header bytes allocated {peak >> 20} MiB"


def test_large_headers_still_round_trip(pair):
    client, server = pair
    header = {"items": [{"name": f"item-{i}", "w": i} for i in range(100_000)]}  # ~3 MiB
    client.send(header, [b"tail"], timeout=30)
    got, buffers = server.recv(timeout=30)
    assert got == header
    assert [bytes(b) for b in buffers] == [b"tail"]


@pytest.mark.parametrize(("text", "ok"), [
    (b'{"op":"x"}', True),
    (b' {"op":"x"} \n', True),  # whitespace around the object, as json.loads allows
    (b'{"op":"x"}{"op":"y"}', False),  # a second value after the header
    (b'{"op":"x"} junk', False),
    (b'{"op":', False),
    (b'\xff\xfe{}', False),  # not UTF-8
    (b'[1, 2]', False),  # not an object
])
def test_a_header_decodes_as_json_loads_would(pair, text: bytes, ok: bool) -> None:
    """Headers are decoded faster than `json.loads` does, and accept and refuse what it
    would: a frame whose header is anything but one JSON object fails with CodecError."""
    import struct

    client, server = pair
    client._sock.setblocking(True)
    client._sock.sendall(struct.pack("!4sII", b"RLF1", len(text), 0) + text)
    if ok:
        assert server.recv(timeout=10) == ({"op": "x"}, [])
    else:
        with pytest.raises(CodecError):
            server.recv(timeout=10)
