"""Authenticated, framed message connections over TCP: the public face of rlinf.comm's wire.

For other packages that need a small control-plane protocol of their own (the device lock
of rlinf.sched is one): a `Listener` accepts connections, `connect` opens one, and each
`Connection` carries *frames* — a JSON header plus any number of raw buffers — in both
directions. Both ends prove they hold the run's shared token (HMAC-SHA256 challenge–response
on both sides) before a payload byte is read, and nothing received is ever unpickled.

Memory: `Connection.send(header, buffers)` reads the caller's buffers in place during the
call and keeps no reference afterwards; the caller still owns them. `Connection.recv()`
returns the header and writable memoryviews on one fresh 64-byte aligned allocation that
the caller owns: it lives as long as any view of it does.

Timeouts: every blocking call takes ``timeout`` (seconds; ``None`` = the connection's
default, `DEFAULT_TIMEOUT`). A timeout before a frame's first byte leaves the connection
usable; one mid-frame closes it. Errors are `rlinf.comm` errors: `AuthenticationError`,
`CommTimeoutError`, `PeerDiedError`, `CodecError`.

Tokens: `new_token()` makes one; `token_env_value(token)` is the string to put in
``RLINF_COMM_TOKEN`` (the variable named by `TOKEN_ENV`) for another process;
`default_token()` reads it back.
"""

from rlinf.comm._internal.wire import (
    DEFAULT_TIMEOUT,
    TOKEN_ENV,
    Address,
    Connection,
    Listener,
    connect,
    default_token,
    new_token,
    token_env_value,
)

__all__ = [
    "DEFAULT_TIMEOUT",
    "TOKEN_ENV",
    "Address",
    "Connection",
    "Listener",
    "connect",
    "default_token",
    "new_token",
    "token_env_value",
]
