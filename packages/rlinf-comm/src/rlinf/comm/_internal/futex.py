"""Linux futex wait and wake on a 32-bit word of shared memory, through libc's `syscall`.

A futex wait sleeps in the kernel until another process wakes the word, and returns at
once if the word no longer holds the value the waiter last saw, so a wake-up between the
waiter's check and its sleep is never lost. One wait or wake costs a system call (about a
microsecond), against a framed socket message's tens. The shared (not private) operations
work across processes that map the same segment.

Where the architecture's syscall number is unknown or libc has no `syscall`, `available()`
is False and callers poll instead.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import platform

__all__ = ["available", "wait", "wake"]

_SYS_FUTEX = {"x86_64": 202, "amd64": 202, "aarch64": 98, "arm64": 98}.get(
    platform.machine().lower())
_FUTEX_WAIT = 0
_FUTEX_WAKE = 1
_WAKE_ALL = 0x7FFFFFFF


class _Timespec(ctypes.Structure):
    _fields_ = [("tv_sec", ctypes.c_long), ("tv_nsec", ctypes.c_long)]


def _load_syscall() -> ctypes._CFuncPtr | None:  # type: ignore[name-defined]
    if _SYS_FUTEX is None:
        return None
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or None, use_errno=True)
        function = libc.syscall
    except (OSError, AttributeError):
        return None
    function.restype = ctypes.c_long
    return function


_syscall = _load_syscall()


def available() -> bool:
    """Whether futex waits work here (Linux on x86-64 or arm64 with a usable libc)."""
    return _syscall is not None


def wait(address: int, expected: int, timeout: float) -> None:
    """Sleep while the word at `address` holds `expected`, at most `timeout` seconds.

    Returns on a wake, a timeout, a signal, or at once when the word differs; the caller
    re-reads the word in every case (spurious returns are allowed).
    """
    assert _syscall is not None, "futex.wait without futex.available()"
    seconds = int(timeout)
    span = _Timespec(seconds, int((timeout - seconds) * 1e9))
    _syscall(_SYS_FUTEX, ctypes.c_void_p(address), _FUTEX_WAIT, ctypes.c_uint32(expected),
             ctypes.byref(span), None, 0)


def wake(address: int) -> None:
    """Wake every process sleeping on the word at `address`."""
    assert _syscall is not None, "futex.wake without futex.available()"
    _syscall(_SYS_FUTEX, ctypes.c_void_p(address), _FUTEX_WAKE, _WAKE_ALL, None, None, 0)
