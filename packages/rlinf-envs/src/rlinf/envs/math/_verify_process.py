"""The verifier's helper process: math-verify comparisons under a deadline that holds in
any thread.

math-verify bounds its work with SIGALRM, which only a process's main thread may use; in
any other thread a comparison such as ``9^{9^{9^9}}`` runs forever while holding the GIL,
and nothing in the process can stop it. So the comparisons run in one persistent helper
interpreter per process (``python -m rlinf.envs.math._verify_child FD``: a fresh
interpreter, not a fork of a process that may hold torch or Ray threads, and one that does
not re-run the caller's main module as multiprocessing's spawn would). The caller waits on
the pipe until the deadline; past it, it kills the helper, and the next comparison starts
a fresh one. Start-up and warm-up count against no deadline.

One helper serves every thread of the process, one comparison at a time: a thread waits
for the comparisons queued before its own, each bounded by its deadline. The helper ends
when its owner closes the pipe or exits, and ends itself a little past a deadline if its
owner died during the comparison (`rlinf.envs.math._verify_child`).
"""

from __future__ import annotations

import atexit
import contextlib
import os
import socket
import subprocess
import sys
import threading
from multiprocessing.connection import Connection

import structlog

from rlinf.envs.errors import VerifierError

__all__ = ["VerifierProcess", "shared_process"]

_log = structlog.get_logger(__name__)

_START_TIMEOUT = 120.0
"""Seconds the helper may take to import math-verify and warm it up."""


class VerifierProcess:
    """A lazily started helper process that compares answers with math-verify."""

    def __init__(self, *, start_timeout: float = _START_TIMEOUT) -> None:
        self.start_timeout = start_timeout
        self._lock = threading.Lock()
        self._process: subprocess.Popen[bytes] | None = None
        self._conn: Connection | None = None
        self._ready = False
        """Whether the running helper said it is warm (a start without waiting leaves it to
        the first comparison)."""

    @property
    def pid(self) -> int | None:
        """Process id of the running helper; None before the first start or after a kill."""
        return self._process.pid if self._process is not None else None

    def start(self, *, wait: bool = True) -> None:
        """Start the helper unless it runs already, and wait until it is warm (`wait`), or
        let the first comparison wait for that."""
        with self._lock:
            if wait:
                self._ensure_started()
            elif self._process is None:
                self._spawn()

    def compare(self, predicted: str, reference: str, *, rel_tol: float,
                timeout: float) -> bool | None:
        """Whether math-verify finds the answers equal; None when it did not answer within
        `timeout` seconds (the helper is then killed) or died on them. Raises
        `VerifierError` when the helper cannot start or math-verify raised."""
        with self._lock:
            conn = self._ensure_started()
            try:
                conn.send((predicted, reference, rel_tol, timeout))
                answered = conn.poll(timeout)
                status, value = conn.recv() if answered else ("timeout", None)
            except (EOFError, OSError):
                status, value = "died", None
            except BaseException:
                self._kill()  # interrupted mid-request: its late answer must not be read
                raise
            if status in ("timeout", "died"):
                code = self._kill()
                _log.warning("verify_timed_out" if status == "timeout" else "verifier_died",
                             timeout=timeout, exit_code=code, predicted=predicted[:80])
                return None
        if status == "error":
            raise VerifierError(f"math-verify failed comparing {predicted[:80]!r} with "
                                f"{reference[:80]!r}: {value}")
        return bool(value)

    def close(self) -> None:
        """Stop the helper (a later comparison starts a new one)."""
        with self._lock:
            self._kill()

    def _ensure_started(self) -> Connection:
        if self._process is not None and self._conn is not None:
            if self._process.poll() is None:
                if self._ready:
                    return self._conn
                return self._await_ready(self._process, self._conn)
            self._kill()  # it died while idle (killed from outside): start afresh
        process, conn = self._spawn()
        return self._await_ready(process, conn)

    def _spawn(self) -> tuple[subprocess.Popen[bytes], Connection]:
        """Start a helper (not waiting for it)."""
        ours, theirs = socket.socketpair()
        with theirs:
            process = subprocess.Popen(
                [sys.executable, "-m", "rlinf.envs.math._verify_child", str(theirs.fileno())],
                pass_fds=(theirs.fileno(),))
        conn = Connection(ours.detach())
        self._process, self._conn, self._ready = process, conn, False
        return process, conn

    def _await_ready(self, process: subprocess.Popen[bytes], conn: Connection) -> Connection:
        """Wait for a started helper's ready message (at most `start_timeout`)."""
        try:
            if not conn.poll(self.start_timeout):
                raise VerifierError(f"the verifier's helper process (pid {process.pid}) was "
                                    f"not ready within {self.start_timeout} s")
            status, detail = conn.recv()
        except (EOFError, OSError) as exc:
            code = self._kill()
            raise VerifierError(f"the verifier's helper process exited at start (exit code "
                                f"{code})") from exc
        except BaseException:
            self._kill()
            raise
        if status != "ready":
            self._kill()
            raise VerifierError(f"the verifier's helper process failed to start:\n{detail}")
        self._ready = True
        return conn

    def _kill(self) -> int | None:
        """Kill the helper if there is one; its exit code."""
        process, conn = self._process, self._conn
        self._process = self._conn = None
        self._ready = False
        if conn is not None:
            conn.close()
        if process is None:
            return None
        process.kill()
        return process.wait()

    def _forget(self) -> None:
        """In a forked child: the helper belongs to the parent; this process starts its own."""
        self._lock = threading.Lock()
        self._process = None
        self._ready = False
        if self._conn is not None:
            with contextlib.suppress(OSError):
                self._conn.close()  # our copy of the descriptor only
        self._conn = None


_shared: list[VerifierProcess] = []
"""This process's helper once created (a list, so creating it needs no global rebinding)."""
_shared_lock = threading.Lock()


def shared_process() -> VerifierProcess:
    """This process's helper (created on first use, stopped at exit, not inherited by a
    forked child)."""
    with _shared_lock:
        if not _shared:
            helper = VerifierProcess()
            atexit.register(helper.close)
            os.register_at_fork(after_in_child=helper._forget)
            _shared.append(helper)
        return _shared[0]
