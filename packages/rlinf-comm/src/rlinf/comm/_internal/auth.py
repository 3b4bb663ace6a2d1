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

from rlinf.comm._internal.logs import get_logger
from rlinf.comm._internal.sockio import Deadline, recv_exact_into, send_all
from rlinf.comm.errors import AuthenticationError, PeerDiedError

__all__ = ["TOKEN_ENV", "ServerHandshake", "check_token", "client_handshake", "default_token",
           "new_token", "token_env_value"]

log = get_logger(__name__)

TOKEN_ENV = "RLINF_COMM_TOKEN"
_HELLO = b"RLINF-COMM-AUTH1"  # 16 bytes, sent by the listener with its challenge
_NONCE = 32
_DIGEST = 32
_MIN_TOKEN = 16


def new_token() -> bytes:
    """A fresh random 32-byte token to share between the processes of one run."""
    return secrets.token_bytes(32)


def token_env_value(token: bytes) -> str:
    """What to put in ``RLINF_COMM_TOKEN`` (hex) so that `default_token()` returns `token`
    in every process that inherits it."""
    check_token(token)
    return bytes(token).hex()


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


class ServerHandshake:
    """The listener's side of the handshake as a non-blocking state machine.

    A listener runs many of these at once from one thread (`wire.Listener`), so a client
    that connects and stays silent holds one socket until its deadline and delays nobody:

    - `outgoing` holds bytes to write (the greeting, later the listener's proof);
    - `feed(data)` takes bytes read from the client and returns how many more it needs;
    - `verify(peer)` checks the client's proof once 64 bytes arrived; on success it queues
      the listener's proof in `outgoing` and returns True.
    """

    REPLY = _NONCE + _DIGEST

    def __init__(self, token: bytes) -> None:
        self._token = token
        self._server_nonce = secrets.token_bytes(_NONCE)
        self.outgoing = _HELLO + self._server_nonce
        self._reply = bytearray()

    def feed(self, data: bytes) -> int:
        """Take client bytes (at most what is missing); returns bytes still missing."""
        self._reply += data[: self.REPLY - len(self._reply)]
        return self.REPLY - len(self._reply)

    def verify(self, peer: object) -> bool:
        """Whether the client proved the token (call once `feed` returned 0)."""
        reply = bytes(self._reply)
        client_nonce, digest = reply[:_NONCE], reply[_NONCE:]
        if len(reply) != self.REPLY or not hmac.compare_digest(
                digest, _mac(self._token, b"c2s", self._server_nonce, client_nonce)):
            log.warning("authentication_failed", peer=peer)
            return False
        self.outgoing = _mac(self._token, b"s2c", client_nonce, self._server_nonce)
        return True


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
