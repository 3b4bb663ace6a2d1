"""What a cached profile is keyed by (`profile_identity`)."""

from __future__ import annotations

from importlib import metadata

from rlinf.workers.flow.auto import PROFILE_FORMAT
from rlinf.workers.training import profile_identity


def test_the_identity_holds_the_config_the_versions_installed_and_the_formats() -> None:
    identity = profile_identity({"model.width": 8}, distributions=("torch", "no-such-dist"),
                                probes=2)
    assert identity == {"config": {"model.width": 8},
                        "versions": {"torch": metadata.version("torch")},
                        "profile_format": PROFILE_FORMAT, "probes": 2}
    assert profile_identity({"model.width": 16}, distributions=()) != \
        profile_identity({"model.width": 8}, distributions=())


def test_the_first_guess_collocates_on_no_more_cpu_slots_than_cores() -> None:
    from rlinf.sched import Cluster
    from rlinf.workers.training import collocated_devices

    assert collocated_devices(Cluster.uniform(1, 4, "8GiB", "cpu", cpus_per_node=2)) == 2
    assert collocated_devices(Cluster.uniform(1, 2, "8GiB", "cpu", cpus_per_node=8)) == 2
    assert collocated_devices(Cluster.uniform(1, 4, "8GiB", "cpu")) == 4  # cores unknown
    assert collocated_devices(Cluster.uniform(1, 8, "80GiB", "H100", cpus_per_node=2)) == 8
