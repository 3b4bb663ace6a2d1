"""Fixtures shared by the endpoint and channel tests: a token, a TCP store, this process's
endpoint. Test modules that need other variants define their own, which take precedence."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from rlinf.comm import Endpoint, TCPStore, new_token


@pytest.fixture
def token(monkeypatch: pytest.MonkeyPatch) -> bytes:
    token = new_token()
    monkeypatch.setenv("RLINF_COMM_TOKEN", token.hex())  # inherited by spawned workers
    return token


@pytest.fixture
def store(token: bytes) -> Iterator[TCPStore]:
    with TCPStore.serve(token=token, timeout=60) as owner:
        assert isinstance(owner, TCPStore)
        yield owner


@pytest.fixture
def endpoint(store: TCPStore) -> Iterator[Endpoint]:
    ep = Endpoint("main", store=store).make_current()
    yield ep
    ep.close()
