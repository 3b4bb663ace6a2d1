"""Shared-memory guardian: unlinks a creator's segments once the creator is gone.

Run as a tiny child process of every process that creates segments (see `shm.py`),
by file path with ``python -I``: it imports only the standard library, so it starts in
milliseconds and never imports rlinf.comm or its dependencies.

Protocol on stdin, one line each: ``+NAME`` (about to create NAME) and ``-NAME`` (NAME was
unlinked by its creator). When stdin reaches EOF — the creator exited, cleanly or by
SIGKILL, because the kernel closes its pipe end either way — every name still
registered is unlinked and the guardian exits. Only names of the form
``rlinf-<hex>`` are ever touched.

The guardian detaches at start (it forks; the process its creator started exits at once)
and writes its own pid as the first line of stdout: it is then nobody's child but init's,
so a supervisor that kills a dying process's children with SIGKILL (Ray does, when an
actor is killed) cannot take it down with the creator before it has unlinked.
"""

from __future__ import annotations

import re
import signal
import sys

_NAME = re.compile(r"rlinf-[0-9a-f]{24,64}")


def _unlink(name: str) -> None:
    import _posixshmem

    try:
        _posixshmem.shm_unlink("/" + name)
    except FileNotFoundError:
        pass
    except OSError as exc:  # report and carry on with the other names
        print(f"rlinf-comm guardian: could not unlink {name}: {exc}", file=sys.stderr)


def _detach() -> bool:
    """Continue in a grandchild of the creator and tell the creator its pid. False when the
    creator is gone before reading it (killed while starting its guardian): it registered
    no name yet, since it creates segments only once its guardian is up, so there is
    nothing to guard."""
    import os

    if os.fork() > 0:
        os._exit(0)
    try:
        sys.stdout.write(f"{os.getpid()}\n")
        sys.stdout.flush()
        sys.stdout.close()
    except BrokenPipeError:
        # Redirect first: the interpreter's final flush of the broken stdout would print
        # a second error at exit.
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return False
    return True


def main() -> int:
    if not _detach():
        return 0
    # Ctrl-C in the creator's terminal must not kill us before the creator is gone.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    live: set[str] = set()

    def _cleanup_and_exit(signum: int, frame: object) -> None:
        for name in live:
            _unlink(name)
        sys.exit(0)

    signal.signal(signal.SIGTERM, _cleanup_and_exit)
    for raw in sys.stdin.buffer:
        line = raw.decode("ascii", "replace").strip()
        if len(line) < 2 or not _NAME.fullmatch(line[1:]):
            continue
        if line[0] == "+":
            live.add(line[1:])
        elif line[0] == "-":
            live.discard(line[1:])
    for name in live:
        _unlink(name)
    return 0


if __name__ == "__main__":
    sys.exit(main())
