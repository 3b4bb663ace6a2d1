"""Typed errors of rlinf.comm.

Every error derives from `CommError` and, where one fits, from the matching builtin, so
callers can catch either. All of them pickle (they cross Ray and process boundaries).
"""

from __future__ import annotations


class CommError(Exception):
    """Root of every error raised by rlinf.comm."""


class CommTimeoutError(CommError, TimeoutError):
    """A blocking call did not complete within its timeout."""


class PeerDiedError(CommError, ConnectionError):
    """The process on the other end closed its connection or died."""


class AuthenticationError(CommError, PermissionError):
    """A peer failed the shared-token handshake, or we failed its."""


class InvalidArgumentError(CommError, ValueError):
    """An argument is out of range or of the wrong kind (a NaN timeout, a negative size)."""


class CodecError(CommError, ValueError):
    """A batch cannot be encoded, or received bytes are not a valid encoded batch."""


class TransportError(CommError, RuntimeError):
    """A transport failed to move a payload (bad descriptor, unsupported placement)."""


class ChannelClosedError(CommError, EOFError):
    """The channel was closed: nothing more can be put, or nothing is left to get."""


class MissingExtraError(CommError, ImportError):
    """An optional dependency is missing; the message names the extra to install."""

    def __init__(self, feature: str, extra: str, module: str) -> None:
        super().__init__(
            f"{feature} needs the {module!r} module, which is not installed; "
            f"install it with `pip install 'rlinf-comm[{extra}]'`"
        )
        self.feature = feature
        self.extra = extra
        self.module = module

    def __reduce__(self) -> tuple[type[MissingExtraError], tuple[str, str, str]]:
        return (type(self), (self.feature, self.extra, self.module))
