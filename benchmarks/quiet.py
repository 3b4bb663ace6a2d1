"""Waiting for a quiet machine before a benchmark measures anything."""

from __future__ import annotations

import os
import time

__all__ = ["busy_fraction", "wait_for_idle_cores", "wait_for_quiet"]


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


def _cpu_ticks() -> tuple[int, int]:
    """(busy, total) jiffies of every core since boot, from ``/proc/stat``."""
    with open("/proc/stat") as stat:
        fields = [int(v) for v in stat.readline().split()[1:]]
    idle = fields[3] + (fields[4] if len(fields) > 4 else 0)  # idle + iowait
    return sum(fields) - idle, sum(fields)


def busy_fraction(window: float) -> float:
    """The fraction of the machine's CPU time that was busy over the next `window` seconds."""
    busy0, total0 = _cpu_ticks()
    time.sleep(window)
    busy1, total1 = _cpu_ticks()
    return (busy1 - busy0) / max(1, total1 - total0)


def wait_for_idle_cores(max_busy: float, patience: float, window: float = 1.0) -> float:
    """Seconds waited until one `window` of the machine's CPU is at most `max_busy` busy, or
    `patience` seconds. Between two runs of a benchmark, the load average (a one-minute
    mean) still shows the previous run long after its processes are gone; this sees the
    moment they are (Ray workers exiting, a driver writing its outputs)."""
    started = time.monotonic()
    while busy_fraction(window) > max_busy and time.monotonic() - started < patience:
        pass
    return time.monotonic() - started
