"""The helper side of `rlinf.envs.math._verify_process`: ``python -m`` this module with the
file descriptor of its end of a socket pair. It warms math-verify up, says ``ready``, then
answers comparisons one at a time until EOF (its parent closed the pipe or exited).

Each comparison runs under SIGALRM with the default action, termination: the kernel ends
this process a little after the caller's deadline even if the caller died meanwhile and
the comparison holds the GIL in C code (a huge integer power), where no Python handler
could run. math-verify's own timeouts, which would replace that handler, stay off.

Kept apart from the parent's module so that running it does not import it twice.
"""

from __future__ import annotations

import signal
import sys
import traceback
from multiprocessing.connection import Connection

from rlinf.envs.math._symbolic import symbolic_equal, warm_up

__all__ = ["serve"]

_GRACE = 2.0
"""Seconds past the caller's deadline before the helper ends itself."""


def serve(conn: Connection) -> None:
    """Warm up, then answer ``(predicted, reference, rel_tol, timeout)`` requests with
    ``("ok", equal)`` or ``("error", text)`` until EOF."""
    try:
        warm_up()
    except BaseException:
        conn.send(("error", traceback.format_exc()))
        return
    conn.send(("ready", None))
    signal.signal(signal.SIGALRM, signal.SIG_DFL)
    while True:
        try:
            predicted, reference, rel_tol, timeout = conn.recv()
        except (EOFError, OSError):
            return  # the parent is gone: nothing to answer
        signal.setitimer(signal.ITIMER_REAL, timeout + _GRACE)
        try:
            reply: tuple[str, object] = (
                "ok", symbolic_equal(predicted, reference, rel_tol=rel_tol))
        except Exception as exc:  # sympy raises arbitrary errors on odd LaTeX
            reply = ("error", repr(exc))
        finally:
            signal.setitimer(signal.ITIMER_REAL, 0)
        try:
            conn.send(reply)
        except OSError:
            return


if __name__ == "__main__":
    # Ctrl-C reaches the whole process group: the owner decides, and its closing pipe
    # (EOF) ends this process.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    serve(Connection(int(sys.argv[1])))
