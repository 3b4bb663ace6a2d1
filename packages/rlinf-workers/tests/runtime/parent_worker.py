"""A rank that starts a child process of its own (as an env's subprocess would): imported by
the local backend's tests, and by a driver those tests run as a plain script."""

from __future__ import annotations

import subprocess
import sys

from rlinf.workers.runtime.worker import Worker


class Parent(Worker):
    """Starts a child process of its own (as an env's subprocess would)."""

    def start_child(self) -> int:
        self.child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"])
        return self.child.pid
