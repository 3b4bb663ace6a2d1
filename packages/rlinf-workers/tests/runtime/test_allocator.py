"""The workers' host allocator: which environment it gives, and that it keeps freed pages."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from typing import Any

import pytest
import ray

from rlinf.workers.errors import ConfigError
from rlinf.workers.runtime import HostAllocator, Worker, WorkerGroup, allocator_env
from rlinf.workers.runtime.allocator import ray_jemalloc

ray.cloudpickle.register_pickle_by_value(sys.modules[__name__])

needs_jemalloc = pytest.mark.skipif(ray_jemalloc() is None, reason="Ray ships no jemalloc here")

_REFAULTS = """
import json, resource, torch
def faults_of_touching(mib):
    before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
    block = torch.empty(mib << 20, dtype=torch.uint8)
    block[::4096] = 1
    del block
    return resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before
faults_of_touching(64)
print(json.dumps(faults_of_touching(64)))
"""
"""Touch 64 MiB, free it, touch 64 MiB again: page faults of the second time (torch, as
the workers allocate: NumPy would ask for huge pages, 512x fewer faults)."""


def _refaults(env: dict[str, str]) -> int:
    clean = {k: v for k, v in os.environ.items() if k not in ("LD_PRELOAD", "MALLOC_CONF")}
    done = subprocess.run([sys.executable, "-c", _REFAULTS], env={**clean, **env},
                          capture_output=True, text=True, timeout=120, check=True)
    return int(json.loads(done.stdout.strip().splitlines()[-1]))


def test_system_gives_no_environment() -> None:
    assert allocator_env(HostAllocator("system"), inherited={}) == {}


@needs_jemalloc
def test_jemalloc_is_preloaded_with_its_page_decay_off() -> None:
    env = allocator_env(HostAllocator(), inherited={})
    assert env["LD_PRELOAD"].endswith("libjemalloc.so") and os.path.isfile(env["LD_PRELOAD"])
    assert env["MALLOC_CONF"] == "dirty_decay_ms:-1,muzzy_decay_ms:-1"
    assert "MALLOC_CONF" not in allocator_env(HostAllocator(retain=False), inherited={})


@pytest.mark.parametrize(("env_vars", "inherited"), [
    ({"LD_PRELOAD": "/usr/lib/libtcmalloc_minimal.so.4"}, {}),
    ({}, {"LD_PRELOAD": "/usr/lib/libtcmalloc_minimal.so.4"}),
    ({"MALLOC_CONF": "narenas:1"}, {}),
])
def test_an_allocator_the_user_chose_is_left_alone(env_vars: dict[str, str],
                                                   inherited: dict[str, str]) -> None:
    assert allocator_env(HostAllocator(), env_vars=env_vars, inherited=inherited) == {}


def test_an_unknown_kind_is_refused() -> None:
    with pytest.raises(ConfigError, match="'jemalloc' or 'system'"):
        HostAllocator("tcmalloc")  # type: ignore[arg-type]


@needs_jemalloc
def test_the_retaining_allocator_reuses_freed_pages_where_the_system_one_faults_again() -> None:
    system = _refaults({})
    retained = _refaults(allocator_env(HostAllocator(), inherited={}))
    pages = (64 << 20) // 4096
    assert system > pages // 2  # glibc unmaps a 64 MiB block on free: every page faults again
    assert retained < pages // 20


class MapsWorker(Worker):
    """Reports what its process loaded and its malloc settings."""

    def allocator(self) -> dict[str, Any]:
        with open("/proc/self/maps") as maps:
            loaded = "libjemalloc" in maps.read()
        return {"jemalloc": loaded, "conf": os.environ.get("MALLOC_CONF")}


@needs_jemalloc
@pytest.mark.parametrize("kind", ["jemalloc", "system"])
def test_launched_workers_run_on_the_chosen_allocator(cluster: str, kind: str) -> None:
    if os.environ.get("LD_PRELOAD") or os.environ.get("MALLOC_CONF"):
        pytest.skip("the test process already chose an allocator for every Ray worker")
    group = WorkerGroup.launch(MapsWorker, role="maps", num_ranks=1, num_cpus_per_rank=0.25,
                               allocator=HostAllocator(kind))  # type: ignore[arg-type]
    try:
        report = group.call("allocator")[0]
    finally:
        group.kill()
    assert report["jemalloc"] is (kind == "jemalloc")
    assert (report["conf"] is not None) is (kind == "jemalloc")
