"""Waiting for a quiet machine before a benchmark measures anything."""

from __future__ import annotations

import os
import time

__all__ = ["wait_for_quiet"]


def wait_for_quiet(max_load: float, patience: float) -> float:
    """The 1-minute load average once it is at most `max_load`, or after `patience` seconds
    (an install that just finished leaves the load high for a minute or two)."""
    deadline = time.monotonic() + patience
    load = os.getloadavg()[0]
    if load > max_load:
        print(f"waiting up to {patience:.0f} s for the load average ({load:.2f}) to fall "
              f"to {max_load:.2f} ...", flush=True)
    while load > max_load and time.monotonic() < deadline:
        time.sleep(5.0)
        load = os.getloadavg()[0]
    return load
