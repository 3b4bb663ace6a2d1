"""Run the channel soak in the background while other test commands run, for CI.

The soak (``packages/rlinf-comm/tests -m soak``) runs for ``RLINF_SOAK_SECONDS`` and keeps
about one core busy; run after the other commands of its tox env it would add its whole
length to CI's 90 minutes. So its env starts it first, runs its other tests beside it, and
waits for its verdict at the end:

    python scripts/soak_beside.py start DIR   # returns at once (start DIR -- CMD...: another)
    ...                                       # other test commands
    python scripts/soak_beside.py wait DIR    # the soak's output; its exit code
    python scripts/soak_beside.py stop DIR    # (commands_post) kill it if still running

CI's typecheck runs beside the integration tests the same way (``start DIR -- sh -c "mypy
... && ..."``): they leave part of the two cores idle.

The soak is launched by a small supervisor process that records its exit code in DIR and
kills it if the process that started it (tox) goes away: an interrupted CI leaves nothing
running.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Sequence
from pathlib import Path

SOAK_COMMAND = ("-m", "pytest", "packages/rlinf-comm/tests", "-m", "soak", "-s",
                "-p", "no:cacheprovider")
GRACE_S = 600.0
"""How long `wait` allows beyond ``RLINF_SOAK_SECONDS`` (start-up, the final checks)."""


def _paths(folder: Path) -> tuple[Path, Path, Path]:
    return folder / "soak.log", folder / "soak.rc", folder / "supervisor.pid"


def start(folder: Path, command: Sequence[str] = ()) -> int:
    """Launch the supervisor of `command` (default: the soak), detached, and return."""
    folder.mkdir(parents=True, exist_ok=True)
    log, rc, pid = _paths(folder)
    rc.unlink(missing_ok=True)
    (folder / "command.json").write_text(
        json.dumps(list(command) or [sys.executable, *SOAK_COMMAND]))
    supervisor = subprocess.Popen(
        [sys.executable, __file__, "supervise", str(folder), str(os.getppid())],
        stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
        start_new_session=True)
    pid.write_text(str(supervisor.pid))
    what = (f"soak ({os.environ.get('RLINF_SOAK_SECONDS', '600')} s)" if not command
            else " ".join(command))
    print(f"started beside the next commands: {what} (supervisor pid {supervisor.pid}); "
          f"its output: {log}")
    return 0


def supervise(folder: Path, starter: int) -> int:
    """Run the soak; write its exit code. Kill it (its whole process group) on SIGTERM
    (`stop`) or once `starter` has exited."""
    log, rc, _ = _paths(folder)
    stopping = False

    def on_term(signum: int, frame: object) -> None:
        nonlocal stopping
        stopping = True

    signal.signal(signal.SIGTERM, on_term)
    with log.open("wb") as out:
        command = json.loads((folder / "command.json").read_text())
        soak = subprocess.Popen(command, stdout=out,
                                stderr=subprocess.STDOUT, start_new_session=True)
        while soak.poll() is None:
            if stopping or not _alive(starter):
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(soak.pid, signal.SIGTERM)
                try:
                    soak.wait(timeout=30)
                except subprocess.TimeoutExpired:
                    with contextlib.suppress(ProcessLookupError):
                        os.killpg(soak.pid, signal.SIGKILL)
                    soak.wait()
                break
            time.sleep(0.5)
    rc.write_text(str(soak.returncode))
    return 0


def wait(folder: Path) -> int:
    """Wait for the soak's exit code, print its output, exit with its code."""
    log, rc, pid = _paths(folder)
    if not pid.exists():
        print(f"no soak was started in {folder}: run 'start' first", file=sys.stderr)
        return 2
    limit = float(os.environ.get("RLINF_SOAK_SECONDS", "600")) + GRACE_S
    deadline = time.monotonic() + limit
    while not rc.exists():
        if time.monotonic() > deadline:
            stop(folder)
            print(f"the background command did not finish within {limit:g} s; killed",
                  file=sys.stderr)
            return 1
        time.sleep(1.0)
    sys.stdout.write(log.read_text(errors="replace"))
    code = int(rc.read_text())
    print(f"background command exit code {code}")
    return code


def stop(folder: Path) -> int:
    """Have the supervisor kill the soak if it still runs (a command failed before
    `wait`), and wait until it has; a no-op after `wait`."""
    _, rc, pid = _paths(folder)
    if not pid.exists() or rc.exists():
        return 0
    supervisor = int(pid.read_text())
    with contextlib.suppress(ProcessLookupError):
        os.kill(supervisor, signal.SIGTERM)
    deadline = time.monotonic() + 60
    while _alive(supervisor) and time.monotonic() < deadline:
        time.sleep(0.2)
    print("background command stopped before its end", file=sys.stderr)
    return 0


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("action", choices=("start", "wait", "stop", "supervise"))
    parser.add_argument("folder", type=Path)
    parser.add_argument("starter", type=int, nargs="?", default=0,
                        help="(supervise) the pid whose exit stops the soak")
    argv = sys.argv[1:] if argv is None else argv
    command: list[str] = []
    if "--" in argv:  # start DIR -- CMD...: supervise CMD instead of the soak (tests)
        command, argv = argv[argv.index("--") + 1:], argv[:argv.index("--")]
    args = parser.parse_args(argv)
    if args.action == "supervise":
        return supervise(args.folder, args.starter)
    if args.action == "start":
        return start(args.folder, command)
    return {"wait": wait, "stop": stop}[args.action](args.folder)


if __name__ == "__main__":
    sys.exit(main())
