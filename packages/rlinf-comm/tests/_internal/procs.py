"""Start `comm_workers.py` roles in separate processes, the way a second worker would run."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

from rlinf.comm import TCPStore

WORKERS = Path(__file__).with_name("comm_workers.py")


def spawn(role: str, store: TCPStore, *args: object, node: str | None = None) -> subprocess.Popen:
    """Run `role` of comm_workers.py against `store`; `node` pretends another host."""
    env = dict(os.environ)
    if node is not None:
        env["RLINF_TEST_NODE"] = node
    cmd = [sys.executable, str(WORKERS), role, store.address, *map(str, args)]
    return subprocess.Popen(cmd, env=env)


def stop(pid: int, timeout: float = 10.0) -> None:
    """SIGSTOP `pid` and return once it is stopped (the signal takes effect asynchronously:
    a request sent right after `kill` could still be served)."""
    os.kill(pid, signal.SIGSTOP)
    deadline = time.monotonic() + timeout
    while True:
        with open(f"/proc/{pid}/stat") as stat:
            state = stat.read().rpartition(")")[2].split()[0]
        if state in ("T", "t"):
            return
        if time.monotonic() > deadline:
            raise AssertionError(f"process {pid} did not stop within {timeout} s (state {state})")
        time.sleep(0.005)
