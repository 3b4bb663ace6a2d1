"""Shared-token authentication for rlinf.comm connections.

Mutual HMAC-SHA256 challenge–response, run before any payload byte is read::

    listener -> client: HELLO + server nonce S
    client -> listener: client nonce C + HMAC(token, "c2s" + S + C)
    listener -> client: HMAC(token, "s2c" + C + S)   (only if the client proved itself)

Both reads are fixed-size; the listener reads exactly 64 bytes from an unknown client and
interprets none of them beyond comparing a digest. Nonces on both sides defeat replay.
"""

from __future__ import annotations

import hashlib
import hmac
import os
import secrets
import socket

import structlog

from rlinf.comm._internal.sockio import Deadline, recv_exact_into, send_all
from rlinf.comm.errors import AuthenticationError, PeerDiedError

__all__ = ["TOKEN_ENV", "check_token", "client_handshake", "default_token", "new_token",
           "server_handshake"]

log = structlog.get_logger(__name__)

TOKEN_ENV = "RLINF_COMM_TOKEN"
_HELLO = b"RLINF-COMM-AUTH1"  # 16 bytes, sent by the listener with its challenge
_NONCE = 32
_DIGEST = 32
_MIN_TOKEN = 16


def new_token() -> bytes:
    """A fresh random 32-byte token to share between the processes of one run."""
    return secrets.token_bytes(32)


def default_token() -> bytes:
    """The run's token from the environment variable ``RLINF_COMM_TOKEN`` (hex)."""
    raw = os.environ.get(TOKEN_ENV)
    if not raw:
        raise AuthenticationError(
            f"expected the shared token in env {TOKEN_ENV} (hex, e.g. from "
            f"`python -c 'import secrets; print(secrets.token_hex(32))'`), but it is unset"
        )
    try:
        token = bytes.fromhex(raw.strip())
    except ValueError as exc:
        raise AuthenticationError(
            f"expected env {TOKEN_ENV} to hold hex digits, got {len(raw)} characters "
            "that are not hex"
        ) from exc
    check_token(token)
    return token


def check_token(token: bytes) -> None:
    if not isinstance(token, bytes | bytearray) or len(token) < _MIN_TOKEN:
        got = f"{len(token)} bytes" if isinstance(token, bytes | bytearray) else type(token)
        raise AuthenticationError(f"expected a token of at least {_MIN_TOKEN} bytes, got {got}")


def _mac(token: bytes, label: bytes, *parts: bytes) -> bytes:
    return hmac.new(token, label + b"".join(parts), hashlib.sha256).digest()


def _handshake_io(sock: socket.socket, deadline: Deadline, send: bytes | None,
                  recv: int) -> bytes:
    if send is not None:
        send_all(sock, [memoryview(send)], deadline, "authentication handshake")
    if recv == 0:
        return b""
    buf = bytearray(recv)
    recv_exact_into(sock, memoryview(buf), deadline, "authentication handshake")
    return bytes(buf)


def server_handshake(sock: socket.socket, token: bytes, deadline: Deadline) -> None:
    server_nonce = secrets.token_bytes(_NONCE)
    try:
        reply = _handshake_io(sock, deadline, _HELLO + server_nonce, _NONCE + _DIGEST)
    except PeerDiedError as exc:
        raise AuthenticationError(f"client left during the handshake: {exc}") from exc
    client_nonce, digest = reply[:_NONCE], reply[_NONCE:]
    if not hmac.compare_digest(digest, _mac(token, b"c2s", server_nonce, client_nonce)):
        log.warning("authentication_failed", peer=_peer(sock))
        raise AuthenticationError(
            f"expected client {_peer(sock)} to prove the shared token, got a wrong digest; "
            "connection refused")
    _handshake_io(sock, deadline, _mac(token, b"s2c", client_nonce, server_nonce), 0)


def client_handshake(sock: socket.socket, token: bytes, deadline: Deadline) -> None:
    try:
        hello = _handshake_io(sock, deadline, None, len(_HELLO) + _NONCE)
    except PeerDiedError as exc:
        raise PeerDiedError(f"listener closed before its handshake: {exc}") from exc
    if hello[:len(_HELLO)] != _HELLO:
        raise AuthenticationError(f"expected an rlinf.comm listener greeting {_HELLO!r}, "
                                  f"got {hello[:len(_HELLO)]!r}")
    server_nonce = hello[len(_HELLO):]
    client_nonce = secrets.token_bytes(_NONCE)
    try:
        proof = _handshake_io(sock, deadline,
                              client_nonce + _mac(token, b"c2s", server_nonce, client_nonce),
                              _DIGEST)
    except PeerDiedError as exc:
        raise AuthenticationError(
            "listener closed the connection during the handshake: the tokens differ"
        ) from exc
    if not hmac.compare_digest(proof, _mac(token, b"s2c", client_nonce, server_nonce)):
        raise AuthenticationError("expected the listener to prove the shared token, got a "
                                  "wrong digest")


def _peer(sock: socket.socket) -> str:
    try:
        return str(sock.getpeername())
    except OSError:
        return "<unknown>"
