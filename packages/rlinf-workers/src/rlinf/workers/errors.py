"""Typed errors of rlinf.workers.

Every error derives from `WorkersError` and, where one fits, from the matching builtin, so
callers can catch either. All of them survive pickling (they cross Ray process boundaries):
errors with structured fields rebuild themselves from those fields in `__reduce__`.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

__all__ = [
    "ClusterLostError",
    "ConfigError",
    "DispatchError",
    "GroupClosedError",
    "InvalidConfigError",
    "MissingExtraError",
    "RewardFunctionError",
    "ShapeError",
    "WorkerCallError",
    "WorkerDiedError",
    "WorkerTimeoutError",
    "WorkersError",
]


class WorkersError(Exception):
    """Root of every error raised by rlinf.workers."""


class ConfigError(WorkersError, ValueError):
    """An option or config value is invalid; the message names it and the accepted values."""


class InvalidConfigError(ConfigError):
    """A config key has a wrong type, an out-of-range value or is not a known key; the
    message names the dotted key, the value and what is allowed."""

    def __init__(self, key: str, value: Any, allowed: str) -> None:
        self.key = key
        self.value = value
        self.allowed = allowed
        super().__init__(f"config key {key!r} = {value!r} is invalid: expected {allowed}")

    def __reduce__(self) -> tuple[Any, ...]:
        return (type(self), (self.key, self.value, self.allowed))


class ShapeError(WorkersError, ValueError):
    """Tensors passed to an algorithm or model helper have incompatible shapes."""


class DispatchError(WorkersError, ValueError):
    """Arguments cannot be split across ranks, or results cannot be gathered, per the spec."""


class GroupClosedError(WorkersError, RuntimeError):
    """A call was made on a `WorkerGroup` after `kill()` or `shutdown()`."""


class RewardFunctionError(WorkersError, RuntimeError):
    """A user's reward function raised or returned something other than a finite number;
    the message names the function and quotes the sample it was given."""


def _where(role: str, rank: int, node: str | None) -> str:
    return f"worker {role!r} rank {rank}" + (f" on node {node}" if node else "")


class WorkerDiedError(WorkersError, RuntimeError):
    """A worker process died (crashed, exited or was killed) before answering a call."""

    def __init__(
        self, role: str, rank: int, *, node: str | None = None, method: str | None = None,
        detail: str = "", shared_with: tuple[str, ...] = (),
    ) -> None:
        call = f" while running {method!r}" if method else ""
        super().__init__(
            f"{_where(role, rank, node)} died{call}"
            + (f": {detail}" if detail else "")
            + "; check that worker's log (OOM killer, segfault, os._exit) and relaunch the group"
        )
        self.role = role
        self.rank = rank
        self.node = node
        self.method = method
        self.detail = detail
        self.shared_with = tuple(shared_with)
        """The other components served by the process that died (any of them may have
        caused it)."""

    @property
    def process(self) -> str:
        """The components of the process that died, ``+``-joined in name order (``env`` for a
        process of its own, ``actor+env`` for one that two components share)."""
        return "+".join(sorted((self.role, *self.shared_with)))

    def __reduce__(self) -> tuple[Any, ...]:
        return (_rebuild, (type(self), (self.role, self.rank), {
            "node": self.node, "method": self.method, "detail": self.detail,
            "shared_with": self.shared_with}))


class ClusterLostError(WorkersError, RuntimeError):
    """The Ray cluster itself is gone or unreachable (``ray stop``, the head node lost, a
    wrong ``RAY_ADDRESS``): no worker can be restarted until Ray runs again."""

    def __init__(self, address: str | None, *, detail: str = "") -> None:
        where = f" at {address}" if address else ""
        super().__init__(
            f"the Ray cluster{where} is gone or unreachable (ray stop, its head node lost, or "
            f"a wrong RAY_ADDRESS)" + (f": {detail}" if detail else "")
            + "; start Ray again (or unset RAY_ADDRESS for a local instance)")
        self.address = address
        self.detail = detail

    def __reduce__(self) -> tuple[Any, ...]:
        return (_rebuild, (type(self), (self.address,), {"detail": self.detail}))


class WorkerTimeoutError(WorkersError, TimeoutError):
    """Some ranks did not answer a call within its timeout; the message lists them."""

    def __init__(self, role: str, ranks: Sequence[int], *, method: str, timeout: float) -> None:
        super().__init__(
            f"worker {role!r} rank(s) {list(ranks)} did not finish {method!r} within "
            f"{timeout:g} s; raise the timeout or look for a stuck rank (deadlock, busy device)"
        )
        self.role = role
        self.ranks = tuple(ranks)
        self.method = method
        self.timeout = timeout

    def __reduce__(self) -> tuple[Any, ...]:
        return (_rebuild, (type(self), (self.role, self.ranks), {
            "method": self.method, "timeout": self.timeout}))


class WorkerCallError(WorkersError, RuntimeError):
    """A worker method raised; `cause` holds the original exception when it could be kept."""

    def __init__(
        self, role: str, rank: int, *, method: str, detail: str, node: str | None = None,
        cause: BaseException | None = None,
    ) -> None:
        super().__init__(f"{_where(role, rank, node)} raised in {method!r}: {detail}")
        self.role = role
        self.rank = rank
        self.method = method
        self.detail = detail
        self.node = node
        self.cause = cause

    def __reduce__(self) -> tuple[Any, ...]:
        return (_rebuild, (type(self), (self.role, self.rank), {
            "method": self.method, "detail": self.detail, "node": self.node,
            "cause": self.cause}))


class MissingExtraError(WorkersError, ImportError):
    """An optional dependency is missing; the message names the extra to install."""

    def __init__(self, feature: str, extra: str, module: str) -> None:
        super().__init__(
            f"{feature} needs the {module!r} module, which is not installed; "
            f"install it with `pip install 'rlinf-workers[{extra}]'`"
        )
        self.feature = feature
        self.extra = extra
        self.module = module

    def __reduce__(self) -> tuple[Any, ...]:
        return (type(self), (self.feature, self.extra, self.module))


def _rebuild(
    cls: type[Exception], args: tuple[Any, ...], kwargs: dict[str, Any]
) -> Exception:
    return cls(*args, **kwargs)
