"""A worker's CPU threads: torch's intra-op pool and NumPy's BLAS pool, set together.

A CPU device is a core slot, and a worker given ``k`` slots computes on ``k`` threads.
`torch.set_num_threads` governs only torch's OpenMP pool. NumPy's matmuls run on the
OpenBLAS it bundles, whose pool starts with one thread per core and busy-waits between
calls. The embodied PPO kernel (`rlinf.workers.embodied.mlp_ppo`) is NumPy, so a "one
thread" actor used both cores of the 2-core machine. There, with a 256x256 MLP, 16 envs
x 128 steps, 10 epochs of minibatches of 64:

- one BLAS thread: the same update time on an idle machine or beside a busy core;
- default (two): no quicker on an idle machine and varying from run to run, at twice the
  CPU-seconds, and several times slower beside a busy core, as in a pipelined run where an
  env worker steps on the other core. The planner priced that update from a profile taken
  at one of those moments.

`set_cpu_threads` sets both pools for the process (OpenBLAS's count is process-wide; OpenMP's
is per calling thread, so roles call it again on Ray's call threads); `cpu_threads` sets them
for a block and restores the previous count.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

import torch
from threadpoolctl import ThreadpoolController

__all__ = ["cpu_threads", "set_cpu_threads"]

_controllers: dict[str, ThreadpoolController] = {}
"""The process's thread-pool controller, under the key ``"process"``."""


def _blas(*, rescan: bool) -> ThreadpoolController:
    """The process's thread-pool controller; `rescan` looks again for BLAS libraries loaded
    since (a scan costs far more than setting a limit)."""
    if rescan or "process" not in _controllers:
        _controllers["process"] = ThreadpoolController()
    return _controllers["process"]


def set_cpu_threads(count: int, *, rescan: bool = True) -> None:
    """Compute on `count` threads from now on: torch's intra-op threads on the calling thread
    and every BLAS library's pool in the process."""
    if count < 1:
        raise ValueError(f"a worker computes on at least one thread, got {count}")
    torch.set_num_threads(count)
    _blas(rescan=rescan).limit(limits=count, user_api="blas")


@contextmanager
def cpu_threads(count: int) -> Iterator[None]:
    """Compute on `count` threads inside the block (`set_cpu_threads`), then return to the
    calling thread's previous torch thread count for both pools."""
    previous = torch.get_num_threads()
    set_cpu_threads(count, rescan=False)
    try:
        yield
    finally:
        set_cpu_threads(previous, rescan=False)
