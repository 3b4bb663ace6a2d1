"""Profiles cached under a key of workflow, model and cluster."""

from __future__ import annotations

from pathlib import Path

import pytest

from rlinf.sched import profile_cache
from rlinf.sched.cluster import Cluster
from rlinf.sched.errors import ProfileError
from rlinf.sched.profile_cache import ProfileCache, host_cpu, profile_key
from rlinf.sched.profiler import Measurement, Profile
from rlinf.sched.workflow import Component, Edge, Workflow

WF = Workflow((Component("rollout"), Component("actor")), (Edge("rollout", "actor"),),
              global_batch=8)
CLUSTER = Cluster.uniform(1, 2, 10**9, "cpu")


def measured() -> Profile:
    return Profile((Measurement("rollout", 8, 1, 0.5, 100), Measurement("actor", 8, 1, 0.25, 50)))


def test_the_key_changes_with_workflow_model_and_cluster() -> None:
    key = profile_key(workflow=WF, cluster=CLUSTER, model={"hidden": 128})
    assert key == profile_key(workflow=WF, cluster=CLUSTER, model={"hidden": 128})
    other_wf = Workflow(WF.components, WF.edges, global_batch=16)
    assert key != profile_key(workflow=other_wf, cluster=CLUSTER, model={"hidden": 128})
    assert key != profile_key(workflow=WF, cluster=Cluster.uniform(1, 4, 10**9, "cpu"),
                              model={"hidden": 128})
    assert key != profile_key(workflow=WF, cluster=CLUSTER, model={"hidden": 256})


def test_measures_once_then_reuses(tmp_path: Path) -> None:
    cache = ProfileCache(tmp_path / "profiles")
    key = profile_key(workflow=WF, cluster=CLUSTER, model={"hidden": 128})
    calls = []

    def measure() -> Profile:
        calls.append(1)
        return measured()

    first, cached = cache.get_or_measure(key, measure)
    assert not cached and len(calls) == 1
    again, cached = cache.get_or_measure(key, measure)
    assert cached and len(calls) == 1
    assert again.measurements == first.measurements


def test_an_unreadable_entry_is_measured_again(tmp_path: Path) -> None:
    cache = ProfileCache(tmp_path)
    key = profile_key(workflow=WF, cluster=CLUSTER, model={})
    cache.path(key).write_text("{not json")
    profile, cached = cache.get_or_measure(key, measured)
    assert not cached and profile.measurements
    assert cache.load(key) is not None


def test_bad_keys_are_refused(tmp_path: Path) -> None:
    with pytest.raises(ProfileError, match="hex"):
        ProfileCache(tmp_path).path("../etc/passwd")


def test_the_key_ignores_what_changes_between_sessions_of_one_machine() -> None:
    def described(memory: int, hostname: str) -> Cluster:
        return Cluster.from_dict({"nodes": [{"devices": 2, "device_kind": "cpu",
                                             "device_memory": memory // 2, "backend": "cpu",
                                             "cpus": 2, "memory": memory,
                                             "hostname": hostname}]})

    one, other = described(17_566_895_719, "vm"), described(17_001_000_000, "vm-2")
    assert profile_key(workflow=WF, cluster=one, model={}) == profile_key(
        workflow=WF, cluster=other, model={})


def test_a_profile_that_cannot_be_stored_is_still_returned(tmp_path: Path) -> None:
    blocker = tmp_path / "file"
    blocker.write_text("not a folder")
    cache = ProfileCache(blocker / "profiles")
    key = profile_key(workflow=WF, cluster=CLUSTER, model={})
    profile, cached = cache.get_or_measure(key, measured)
    assert not cached and profile.measurements


AVX512_HOST = ("processor\t: 0\nmodel name\t: AMD EPYC 9R14\n"
               "flags\t\t: fpu sse avx2 avx512f avx512_bf16\n")
AVX2_HOST = "processor\t: 0\nmodel name\t: AMD EPYC\nflags\t\t: fpu sse avx2 fma\n"


def test_host_cpu_names_the_model_and_its_vector_extensions() -> None:
    assert host_cpu(AVX512_HOST) == {"model": "AMD EPYC 9R14",
                                     "vector": ["avx2", "avx512_bf16", "avx512f"]}
    assert host_cpu(AVX2_HOST)["vector"] == ["avx2"]
    assert host_cpu("")["vector"] == []


def test_the_key_changes_with_the_host_cpu(monkeypatch: pytest.MonkeyPatch) -> None:
    """A profile measured where bf16 matmuls are native is not reused where they are not."""
    keys = []
    for text in (AVX512_HOST, AVX2_HOST):
        monkeypatch.setattr(profile_cache, "host_cpu", lambda text=text: host_cpu(text))
        keys.append(profile_key(workflow=WF, cluster=CLUSTER, model={}))
    assert keys[0] != keys[1]
