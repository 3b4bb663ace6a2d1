"""Profiles cached under a key of workflow, model and cluster, and reused.

Profiling a workflow costs a short run of every component at several batch sizes. When the
same workflow runs again on the same model and cluster, the profile it measured is still
what the planner should price, so `ProfileCache` keeps it::

    cache = ProfileCache("~/.cache/rlinf/profiles")
    key = profile_key(workflow=wf, cluster=cluster, model={"hidden": 128, "layers": 2})
    profile, cached = cache.get_or_measure(key, lambda: measure(...))

The key is a SHA-256 of canonical JSON: the workflow's document (`Workflow.to_dict`), the
cluster's hardware (per node: device count, kind, backend, NVLink, cores, and GPU memory in
whole GiB; not host names, addresses or the memory Ray happens to report free, which
change between sessions of the same machine), the CPU of the host that computes the key
(model name and the vector extensions matmuls use: a VM moved to a host without AVX-512
BF16 keeps its core count, but its bf16 training steps run far slower than fp32) and
whatever describes the model and the code that runs it (the caller's mapping: sizes, dtype,
engine, versions). Anything that changes what a component costs belongs in that mapping. A
cached file that cannot be read is measured again and replaced, never trusted.
"""

from __future__ import annotations

import hashlib
import json
import os
import platform
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import structlog

from rlinf.sched.cluster import Cluster
from rlinf.sched.errors import ProfileError
from rlinf.sched.profiler import Profile
from rlinf.sched.workflow import Workflow

__all__ = ["ProfileCache", "host_cpu", "profile_key"]

_log = structlog.get_logger(__name__)


def profile_key(*, workflow: Workflow, cluster: Cluster, model: Mapping[str, Any]) -> str:
    """A stable hex key for the profile of `workflow` with `model` on `cluster`."""
    document = {"workflow": workflow.to_dict(), "cluster": _hardware(cluster),
                "host_cpu": host_cpu(), "model": dict(model)}
    try:
        text = json.dumps(document, sort_keys=True, separators=(",", ":"), default=str)
    except (TypeError, ValueError) as exc:
        raise ProfileError(f"cannot build a profile key ({exc}): expected JSON-able model "
                           "description values") from exc
    return hashlib.sha256(text.encode()).hexdigest()[:32]


_VECTOR_FLAGS = ("avx2", "avx512f", "avx512_bf16", "avx512_vnni", "amx_bf16", "amx_tile",
                 "asimd", "sve")
"""CPU flags that change how fast torch's CPU kernels run (x86 AVX/AMX, Arm NEON/SVE)."""


def host_cpu(cpuinfo: str | None = None) -> dict[str, Any]:
    """This host's CPU model name and which of `_VECTOR_FLAGS` it has, from `cpuinfo` (the
    text of /proc/cpuinfo; read here by default, empty where there is none)."""
    if cpuinfo is None:
        try:
            cpuinfo = Path("/proc/cpuinfo").read_text(errors="replace")
        except OSError:
            cpuinfo = ""
    model, flags = platform.processor(), set()
    for line in cpuinfo.splitlines():
        name, _, value = line.partition(":")
        name = name.strip().lower()
        if name in ("model name", "cpu model") and value.strip():
            model = value.strip()
        elif name in ("flags", "features"):
            flags.update(value.split())
    return {"model": model, "vector": sorted(flag for flag in _VECTOR_FLAGS if flag in flags)}


def _hardware(cluster: Cluster) -> list[dict[str, Any]]:
    """What of a cluster shapes component costs, stable across sessions of one machine."""
    nodes = []
    for node in cluster.to_dict()["nodes"]:
        gib = round(int(node["device_memory"]) / 2**30) if node.get("backend") == "cuda" else 0
        nodes.append({"count": node.get("count", 1), "devices": node["devices"],
                      "kind": node["device_kind"], "backend": node.get("backend"),
                      "nvlink": node.get("nvlink"), "cpus": node.get("cpus"),
                      "device_memory_gib": gib})
    return nodes


class ProfileCache:
    """A directory of profiles, one JSON file per key (written atomically by `Profile`)."""

    def __init__(self, directory: str | os.PathLike[str]) -> None:
        self.directory = Path(directory).expanduser()

    def path(self, key: str) -> Path:
        """Where the profile of `key` lives."""
        if not key or not all(c in "0123456789abcdef" for c in key):
            raise ProfileError(f"profile key {key!r}: expected the hex string of profile_key")
        return self.directory / f"{key}.json"

    def load(self, key: str) -> Profile | None:
        """The cached profile of `key`, or None when absent or unreadable."""
        path = self.path(key)
        if not path.exists():
            return None
        try:
            return Profile.load(path)
        except (ProfileError, OSError, ValueError) as exc:
            _log.warning("profile_cache_unreadable", path=str(path), error=str(exc))
            return None

    def save(self, key: str, profile: Profile) -> Path:
        """Store `profile` under `key`; returns its path."""
        self.directory.mkdir(parents=True, exist_ok=True)
        path = self.path(key)
        profile.save(path)
        return path

    def get_or_measure(self, key: str,
                       measure: Callable[[], Profile]) -> tuple[Profile, bool]:
        """The cached profile of `key` (True), or `measure()`'s, stored (False). A profile
        that cannot be stored is still returned (the failure is logged): measuring is the
        expensive part, and the run can go on without the cache."""
        cached = self.load(key)
        if cached is not None and cached.measurements:
            _log.info("profile_cache_hit", key=key)
            return cached, True
        profile = measure()
        try:
            self.save(key, profile)
        except OSError as exc:
            _log.warning("profile_cache_store_failed", directory=str(self.directory),
                         error=str(exc))
            return profile, False
        _log.info("profile_cache_stored", key=key, measurements=len(profile.measurements))
        return profile, False
