"""Start `comm_workers.py` roles in separate processes, the way a second worker would run."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from rlinf.comm import TCPStore

WORKERS = Path(__file__).with_name("comm_workers.py")


def spawn(role: str, store: TCPStore, *args: object, node: str | None = None) -> subprocess.Popen:
    """Run `role` of comm_workers.py against `store`; `node` pretends another host."""
    env = dict(os.environ)
    if node is not None:
        env["RLINF_TEST_NODE"] = node
    cmd = [sys.executable, str(WORKERS), role, store.address_str, *map(str, args)]
    return subprocess.Popen(cmd, env=env)
