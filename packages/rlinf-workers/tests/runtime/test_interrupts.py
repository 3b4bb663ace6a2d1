"""A Ctrl-C that some call swallows is raised again by the wait loops of a flow step and of
a group call; one during a teardown is held until the teardown has ended."""

from __future__ import annotations

import _thread
import signal
import threading
import time

import pytest

from rlinf.workers.runtime.interrupts import check_interrupted, hold_interrupts, keep_interrupts


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


def test_a_thread_waiting_inside_a_step_neither_restores_the_handler_nor_raises() -> None:
    # A pool thread's group call (keep_interrupts inside) can outlive the main thread's
    # block: restoring the handler from it would raise ValueError (signal only works in the
    # main thread), and a re-raise there would end that thread, not the run.
    entered, release, errors = threading.Event(), threading.Event(), []

    def pool_thread() -> None:
        try:
            with keep_interrupts():
                entered.set()
                release.wait(10)
                check_interrupted()
        except BaseException as exc:
            errors.append(exc)

    with keep_interrupts():
        worker = threading.Thread(target=pool_thread)
        worker.start()
        assert entered.wait(10)
        _swallow_a_ctrl_c()
        with pytest.raises(KeyboardInterrupt, match="raised again"):
            check_interrupted()
        _swallow_a_ctrl_c()  # recorded again; only the main thread may re-raise it
    release.set()
    worker.join(10)
    assert errors == []
    assert signal.getsignal(signal.SIGINT) is signal.default_int_handler


def test_a_group_call_raises_a_ctrl_c_that_its_wait_swallowed(
        monkeypatch: pytest.MonkeyPatch) -> None:
    # An evaluation or checkpoint call (GroupFuture.rank_results) waits outside any flow
    # step: the first ray.wait swallows the Ctrl-C, the next slice raises it again.
    import ray

    from rlinf.workers.runtime import RANK_ZERO, GroupFuture

    waits: list[float] = []

    def swallowing_wait(refs: list[object], *, num_returns: int,
                        timeout: float) -> tuple[list[object], list[object]]:
        waits.append(timeout)
        if len(waits) == 1:
            _swallow_a_ctrl_c()
        return [], refs

    monkeypatch.setattr(ray, "wait", swallowing_wait)
    future = GroupFuture(role="actor", method="save_checkpoint", ranks=(0,),
                         refs=[object()], spec=RANK_ZERO, nodes={}, default_timeout=60.0)
    started = time.monotonic()
    with pytest.raises(KeyboardInterrupt, match="raised again"):
        future.rank_results(timeout=30.0)
    assert time.monotonic() - started < 5.0
    assert waits and max(waits) <= 1.0  # sliced, not one 30 s wait
    assert signal.getsignal(signal.SIGINT) is signal.default_int_handler


def _ctrl_c_lands() -> None:
    _thread.interrupt_main()
    time.sleep(0.5)  # it would surface here


def test_a_ctrl_c_in_a_held_block_is_raised_once_the_block_has_ended() -> None:
    ran_to_the_end = False
    with pytest.raises(KeyboardInterrupt, match="held until"), hold_interrupts():
        _ctrl_c_lands()
        with hold_interrupts():  # nested: the outermost block raises
            _ctrl_c_lands()
        ran_to_the_end = True
    assert ran_to_the_end
    assert signal.getsignal(signal.SIGINT) is signal.default_int_handler
    with hold_interrupts():
        pass  # the one raised is not raised again


def test_a_held_ctrl_c_gives_way_to_the_blocks_own_error_or_to_reraise_false() -> None:
    with pytest.raises(ValueError), hold_interrupts():
        _ctrl_c_lands()
        raise ValueError("the block's own")
    with hold_interrupts(reraise=False):
        _ctrl_c_lands()
    assert signal.getsignal(signal.SIGINT) is signal.default_int_handler


def test_holding_inside_keep_interrupts_restores_its_handler() -> None:
    with keep_interrupts():
        kept = signal.getsignal(signal.SIGINT)
        with hold_interrupts(reraise=False):
            _ctrl_c_lands()
        assert signal.getsignal(signal.SIGINT) is kept
    assert signal.getsignal(signal.SIGINT) is signal.default_int_handler


def test_holding_leaves_custom_handlers_alone() -> None:
    calls: list[int] = []
    mine = signal.signal(signal.SIGINT, lambda signum, _: calls.append(signum))
    try:
        with hold_interrupts():
            _ctrl_c_lands()
        assert calls == [signal.SIGINT]
    finally:
        signal.signal(signal.SIGINT, mine)
