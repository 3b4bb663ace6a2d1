"""A Ctrl-C that some call swallows during a step is raised again by the step's wait loop."""

from __future__ import annotations

import _thread
import signal
import threading
import time

import pytest

from rlinf.workers.flow.interrupts import check_interrupted, keep_interrupts


def _swallow_a_ctrl_c() -> None:
    """A call that catches the KeyboardInterrupt of a Ctrl-C and goes on."""
    try:
        _thread.interrupt_main()
        time.sleep(0.5)  # the interrupt surfaces here
    except KeyboardInterrupt:
        pass


def test_a_swallowed_ctrl_c_is_raised_again() -> None:
    with keep_interrupts():
        _swallow_a_ctrl_c()
        with pytest.raises(KeyboardInterrupt, match="raised again"):
            check_interrupted()
        check_interrupted()  # once
    assert signal.getsignal(signal.SIGINT) is signal.default_int_handler


def test_without_the_guard_nothing_is_recorded_and_nesting_keeps_it() -> None:
    _swallow_a_ctrl_c()
    check_interrupted()  # not recorded outside keep_interrupts
    with keep_interrupts():
        with keep_interrupts():
            pass
        _swallow_a_ctrl_c()  # the outer guard still records
        with pytest.raises(KeyboardInterrupt):
            check_interrupted()


def test_a_ctrl_c_that_propagated_is_not_raised_twice() -> None:
    with pytest.raises(KeyboardInterrupt), keep_interrupts():
        _thread.interrupt_main()
        time.sleep(0.5)
    with keep_interrupts():
        check_interrupted()


def test_other_threads_and_custom_handlers_are_left_alone() -> None:
    seen: list[object] = []

    def in_thread() -> None:
        with keep_interrupts():
            seen.append(signal.getsignal(signal.SIGINT))

    worker = threading.Thread(target=in_thread)
    worker.start()
    worker.join()
    assert seen == [signal.default_int_handler]
    mine = signal.signal(signal.SIGINT, lambda *_: None)
    try:
        custom = signal.getsignal(signal.SIGINT)
        with keep_interrupts():
            assert signal.getsignal(signal.SIGINT) is custom
    finally:
        signal.signal(signal.SIGINT, mine)
