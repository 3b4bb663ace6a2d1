"""rlinf.comm on its own: what a program that uses only this package needs from it — the
store's address as a string, the token as the env value, and silence on stdout."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap

import pytest

import rlinf.comm
from rlinf.comm import TOKEN_ENV, AuthenticationError, TCPStore, new_token, token_env_value

_QUIET = textwrap.dedent("""
    import numpy as np
    from rlinf.comm import Channel, Endpoint, TCPStore, new_token

    token = new_token()
    with TCPStore.serve(token=token) as store:
        peer = TCPStore(store.address, token=token)
        with Endpoint("a", store=store, token=token) as a, \\
                Endpoint("b", store=peer, token=token) as b:
            a.send({"x": np.arange(4)}, "b", timeout=10)
            a.send({"y": np.zeros(1 << 20)}, "b", timeout=10)
            assert b.recv("a", timeout=10)["x"].tolist() == [0, 1, 2, 3]
            assert b.recv("a", timeout=10)["y"].shape == (1 << 20,)
            with Channel.create("c", store=store, endpoint=a) as channel:
                channel.put({"z": np.ones(3)})
                assert channel.get(timeout=10)["z"].sum() == 3
        peer.close()
""")


def test_the_store_address_is_a_string_another_process_can_connect_to() -> None:
    token = new_token()
    with TCPStore.serve(token=token) as store:
        host, port = store.host_port
        assert isinstance(store.address, str) and store.address == f"{host}:{port}"
        with TCPStore(store.address, token=token) as other:
            other.set("k", b"v")
        assert store.get("k", timeout=5) == b"v"


def test_token_env_value_is_what_default_token_reads(monkeypatch: pytest.MonkeyPatch) -> None:
    token = new_token()
    value = token_env_value(token)
    assert isinstance(value, str) and value == token.hex()
    monkeypatch.setenv(TOKEN_ENV, value)
    assert rlinf.comm.default_token() == token
    with pytest.raises(AuthenticationError, match="at least 16 bytes"):
        token_env_value(b"short")


def test_nothing_is_printed_on_stdout_when_the_host_configures_no_logging() -> None:
    env = {k: v for k, v in os.environ.items() if k != TOKEN_ENV}
    done = subprocess.run([sys.executable, "-c", _QUIET], env=env, check=False,
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert done.stdout == ""
    assert "debug" not in done.stderr
