"""rlinf.comm.wire: the public names other packages use (details in _internal/test_wire.py)."""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor

import pytest

import rlinf.comm
from rlinf.comm import AuthenticationError, wire
from rlinf.comm._internal import wire as internal_wire


def test_public_names_are_the_implementation() -> None:
    for name in wire.__all__:
        assert getattr(wire, name) is getattr(internal_wire, name), name
    assert wire.default_token is rlinf.comm.default_token
    assert wire.new_token is rlinf.comm.new_token


def test_round_trip_through_the_public_module() -> None:
    token = wire.new_token()
    with wire.Listener(token=token) as listener, ThreadPoolExecutor(1) as pool:
        accepted = pool.submit(listener.accept, timeout=10)
        with wire.connect(listener.address, token=token, timeout=10) as client, \
                accepted.result(timeout=10) as server:
            client.send({"op": "ping"}, [b"abc"])
            header, buffers = server.recv(timeout=10)
    assert header == {"op": "ping"}
    assert [bytes(b) for b in buffers] == [b"abc"]


def test_default_token_reads_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(wire.TOKEN_ENV, "ab" * 32)
    assert wire.default_token() == bytes.fromhex("ab" * 32)
    monkeypatch.delenv(wire.TOKEN_ENV)
    with pytest.raises(AuthenticationError, match=wire.TOKEN_ENV):
        wire.default_token()
