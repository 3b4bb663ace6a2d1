"""The host allocator of worker processes: jemalloc that keeps the pages it frees.

An RL iteration allocates and frees the same large host buffers again and again
(activations, logits, gradients of a CPU actor; request batches of a rollout). glibc
``malloc`` serves every block over 32 MiB with its own ``mmap`` and returns it to the kernel
on ``free``, so the next iteration faults the same amount of memory in again and the kernel
zeroes each page. On a virtual machine whose guest reports free pages to its host
(virtio-balloon free page reporting, as on Firecracker and many cloud VMs) a page freed for
~2 s is also dropped by the host, and faulting it back costs far more. On the 2-core
bench VM, touching memory freed a few seconds before was far slower with glibc and with
jemalloc's defaults than with jemalloc keeping its pages, and the collocated reasoning actor
of the held-out bench setting took shorter and steadier steps with the pages kept.

So workers start with Ray's own ``libjemalloc.so`` preloaded and its page decay off
(``dirty_decay_ms:-1,muzzy_decay_ms:-1``): a process keeps its peak heap and reuses it. The
price is that a worker's resident memory stays at its peak, which is what the planner's
memory model already charges it. Intel's PyTorch CPU tuning guide recommends the same
preload for training on CPUs. Where the user already set ``LD_PRELOAD`` or ``MALLOC_CONF``
(e.g. tcmalloc for vLLM on CPU), or Ray ships no jemalloc (not Linux), workers keep what
they have.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

import structlog

from rlinf.workers.errors import ConfigError

__all__ = ["DEFAULT_ALLOCATOR", "HostAllocator", "allocator_env", "ray_jemalloc"]

_log = structlog.get_logger(__name__)

_USER_KEYS = ("LD_PRELOAD", "MALLOC_CONF")
"""Variables that mean the user chose the allocator: left alone."""


@dataclass(frozen=True)
class HostAllocator:
    """Which ``malloc`` worker processes use for host memory.

    `kind`: ``"jemalloc"`` (Ray's build, preloaded) or ``"system"`` (the C library's).
    `retain`: with jemalloc, keep freed pages for reuse instead of returning them to the
    kernel (decay off); False keeps jemalloc's default decay (~10 s).
    """

    kind: Literal["jemalloc", "system"] = "jemalloc"
    retain: bool = True

    def __post_init__(self) -> None:
        if self.kind not in ("jemalloc", "system"):
            raise ConfigError(f"host allocator must be 'jemalloc' or 'system', got "
                              f"{self.kind!r}")


DEFAULT_ALLOCATOR = HostAllocator()
"""Workers' default: jemalloc keeping the pages it frees."""


def ray_jemalloc() -> Path | None:
    """Ray's bundled ``libjemalloc.so`` (its Linux wheels ship one), or None. Found by
    the package's path, without importing Ray (a local run never needs it)."""
    import importlib.util

    spec = importlib.util.find_spec("ray")
    if spec is None or spec.origin is None:
        return None
    library = Path(spec.origin).parent / "core" / "libjemalloc.so"
    return library if library.is_file() else None


def allocator_env(allocator: HostAllocator, *, env_vars: Mapping[str, str] | None = None,
                  inherited: Mapping[str, str] | None = None) -> dict[str, str]:
    """Environment variables that give a worker `allocator`, to add to its `env_vars`.

    Empty for ``"system"``, when `env_vars` or the `inherited` environment (default: this
    process's, which Ray's workers inherit) already set ``LD_PRELOAD`` or ``MALLOC_CONF``,
    or when Ray ships no jemalloc.
    """
    if allocator.kind == "system":
        return {}
    inherited = os.environ if inherited is None else inherited
    chosen = [key for key in _USER_KEYS if key in (env_vars or {}) or inherited.get(key)]
    if chosen:
        _log.debug("host_allocator_left_to_user", variables=chosen)
        return {}
    library = ray_jemalloc()
    if library is None:
        _log.debug("host_allocator_unavailable", wanted="jemalloc",
                   reason="Ray ships no libjemalloc.so here")
        return {}
    env = {"LD_PRELOAD": str(library)}
    if allocator.retain:
        env["MALLOC_CONF"] = "dirty_decay_ms:-1,muzzy_decay_ms:-1"
    return env
