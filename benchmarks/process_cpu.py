"""CPU-seconds of a process tree, from ``/proc`` (Linux).

A contender's CPU cost is what its own processes burned: the benchmark's driver with every
process it started (Ray's daemons and workers, TRL's ranks), not the machine's busy time,
which on a shared machine counts other users' work too.
"""

from __future__ import annotations

import os
from pathlib import Path

__all__ = ["tree_cpu_seconds"]

_TICK = os.sysconf("SC_CLK_TCK")


def _stat(pid: str) -> tuple[int, float] | None:
    """(parent pid, user + system CPU-seconds of the process and of its reaped children)."""
    try:
        raw = Path(f"/proc/{pid}/stat").read_text()
    except OSError:  # gone meanwhile
        return None
    # the command name may hold spaces and parentheses: fields start after the last ')'
    fields = raw[raw.rindex(")") + 2:].split()
    utime, stime, cutime, cstime = (int(fields[i]) for i in (11, 12, 13, 14))
    return int(fields[1]), (utime + stime + cutime + cstime) / _TICK


def tree_cpu_seconds(root: int | None = None) -> float:
    """CPU-seconds used so far by `root` (default: this process) and all its descendants.

    Children that have exited and been waited for are included through their parent's
    ``cutime``/``cstime``; an orphan re-parented to init before it exits is lost.
    """
    root = os.getpid() if root is None else root
    parents: dict[int, int] = {}
    seconds: dict[int, float] = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit() and (stat := _stat(entry)) is not None:
            parents[int(entry)], seconds[int(entry)] = stat
    children: dict[int, list[int]] = {}
    for pid, parent in parents.items():
        children.setdefault(parent, []).append(pid)
    total, todo = 0.0, [root]
    while todo:
        pid = todo.pop()
        total += seconds.get(pid, 0.0)
        todo.extend(children.get(pid, ()))
    return total
