"""Ctrl-C that the driver never loses.

A SIGINT normally surfaces as `KeyboardInterrupt` at the next Python bytecode of the main
thread. In full test-suite runs one has arrived during a flow step and
vanished: the step and the run went on, although no handler of ours catches it; the call
that swallowed it was not found. While a flow step (`rlinf.workers.flow.FlowRun.step`) or a
group call (`GroupFuture.rank_results`: evaluation, checkpoints, weight fetches) waits,
`keep_interrupts` therefore records every SIGINT in a flag besides raising
`KeyboardInterrupt` as usual, and `check_interrupted` (called by those wait loops at least
once a second) raises it again when the flag is set but the exception never arrived. Only
the default handler is replaced, only in the main thread, and it is restored when the
outermost block ends.

A teardown is the opposite case: a second Ctrl-C (users press it again, and tests do once a
second) that lands in it would cut it short and leave workers running. `hold_interrupts`
defers SIGINT over such a block and raises it once the block has ended."""

from __future__ import annotations

import contextlib
import signal
import threading
from collections.abc import Iterator
from types import FrameType

__all__ = ["WAIT_SLICE_S", "check_interrupted", "hold_interrupts", "keep_interrupts"]

WAIT_SLICE_S = 1.0
"""Longest wait between two `check_interrupted` calls of a guarded wait loop."""

_tripped = threading.Event()
_depth = [0]
"""Nesting depth of `keep_interrupts` (a list: module state without ``global``)."""
_held = threading.Event()
_hold_depth = [0]
"""Nesting depth of `hold_interrupts`."""


def _on_sigint(signum: int, frame: FrameType | None) -> None:
    _tripped.set()
    signal.default_int_handler(signum, frame)  # raises KeyboardInterrupt


@contextlib.contextmanager
def keep_interrupts() -> Iterator[None]:
    """Record SIGINTs while the block runs (main thread, default handler only; nests).
    Other threads (group calls waited on by a pool) pass through: only the main thread
    receives SIGINT, installs handlers and re-raises."""
    owner = _on_main_thread() and (
        _depth[0] > 0 or signal.getsignal(signal.SIGINT) is signal.default_int_handler)
    if not owner:
        yield
        return
    if _depth[0] == 0:
        _tripped.clear()
        signal.signal(signal.SIGINT, _on_sigint)
    _depth[0] += 1
    try:
        yield
    finally:
        _depth[0] -= 1
        if _depth[0] == 0:
            signal.signal(signal.SIGINT, signal.default_int_handler)
            _tripped.clear()  # raised or re-raised by now, or the block ended first


@contextlib.contextmanager
def hold_interrupts(*, reraise: bool = True) -> Iterator[None]:
    """Defer SIGINTs while the block runs (main thread, default or `keep_interrupts`'s
    handler only; nests); when the outermost block ends without an exception of its own,
    raise `KeyboardInterrupt` for one that arrived (unless not `reraise`: the caller raises
    an exception of its own anyway, e.g. the first Ctrl-C's)."""
    previous = signal.getsignal(signal.SIGINT)
    owner = _on_main_thread() and (
        _hold_depth[0] > 0 or previous in (signal.default_int_handler, _on_sigint))
    if not owner:
        yield
        return
    outermost = _hold_depth[0] == 0
    if outermost:
        _held.clear()
        signal.signal(signal.SIGINT, _on_held_sigint)
    _hold_depth[0] += 1
    try:
        yield
    finally:
        _hold_depth[0] -= 1
        if outermost:
            signal.signal(signal.SIGINT, previous)
    if outermost and reraise and _held.is_set():
        _held.clear()
        raise KeyboardInterrupt("Ctrl-C during a teardown (held until it had ended)")


def _on_held_sigint(signum: int, frame: FrameType | None) -> None:
    _held.set()


def check_interrupted() -> None:
    """Raise `KeyboardInterrupt` for a SIGINT recorded by `keep_interrupts` whose exception
    some call swallowed (main thread only: another thread's KeyboardInterrupt would end
    that thread, not the run)."""
    if _on_main_thread() and _tripped.is_set():
        _tripped.clear()
        raise KeyboardInterrupt("Ctrl-C (raised again: the first one was swallowed)")


def _on_main_thread() -> bool:
    return threading.current_thread() is threading.main_thread()
