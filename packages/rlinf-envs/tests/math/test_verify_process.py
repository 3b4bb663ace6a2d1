from __future__ import annotations

import signal
import threading

import pytest

pytest.importorskip("math_verify", reason="rlinf-envs[math]")

from rlinf.envs import VerifierError
from rlinf.envs.math._verify_process import VerifierProcess, shared_process

SLOW = "(9^{9})^{9^{9}}"
"""Takes math-verify minutes (it computes 387420489^387420489) while holding the GIL."""


@pytest.fixture
def helper():  # type: ignore[no-untyped-def]
    process = VerifierProcess()
    yield process
    process.close()


def test_it_starts_once_and_answers(helper: VerifierProcess) -> None:
    assert helper.pid is None  # started lazily
    helper.start()
    pid = helper.pid
    helper.start()
    assert helper.pid == pid
    assert helper.compare("\\sqrt{4}", "2", rel_tol=0.0, timeout=30) is True
    assert helper.compare("\\sqrt{5}", "2", rel_tol=0.0, timeout=30) is False
    assert helper.pid == pid
    helper.close()
    assert helper.pid is None


def test_a_start_without_waiting_leaves_the_wait_to_the_first_comparison(
        helper: VerifierProcess) -> None:
    helper.start(wait=False)  # returns while the helper still imports math-verify
    pid = helper.pid
    assert pid is not None
    helper.start(wait=False)
    assert helper.pid == pid  # one helper
    assert helper.compare("\\frac{1}{2}", "0.5", rel_tol=0.0, timeout=30) is True
    assert helper.pid == pid


def test_past_the_deadline_it_is_killed_and_replaced(helper: VerifierProcess) -> None:
    results: list[bool | None] = []
    worker = threading.Thread(
        target=lambda: results.append(helper.compare(SLOW, "3", rel_tol=0.0, timeout=1.0)),
        daemon=True)
    worker.start()
    worker.join(timeout=120)
    assert not worker.is_alive()
    assert results == [None]
    assert helper.pid is None
    assert helper.compare("\\sqrt{4}", "2", rel_tol=0.0, timeout=30) is True  # a fresh one


def test_a_helper_killed_while_idle_is_restarted(helper: VerifierProcess) -> None:
    helper.start()
    assert helper._process is not None
    helper._process.kill()
    helper._process.wait()
    assert helper.compare("\\sqrt{4}", "2", rel_tol=0.0, timeout=30) is True


def test_the_helper_ends_itself_past_a_deadline_nobody_enforces(helper: VerifierProcess) -> None:
    # As if its owner had died mid-comparison: the helper's own alarm ends it.
    helper.start()
    assert helper._conn is not None and helper._process is not None
    helper._conn.send((SLOW, "3", 0.0, 0.5))
    assert helper._process.wait(timeout=60) == -signal.SIGALRM


def test_a_helper_that_cannot_start_says_so(monkeypatch: pytest.MonkeyPatch) -> None:
    import rlinf.envs.math._verify_process as module

    monkeypatch.setattr(module.sys, "executable", "/bin/false")
    with pytest.raises(VerifierError, match="exited at start"):
        VerifierProcess().start()


def test_one_shared_helper_per_process() -> None:
    assert shared_process() is shared_process()
