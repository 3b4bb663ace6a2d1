"""Multirun sweeps: ``<app> -m algorithm.lr=1e-4,3e-4 run.seed=0,1`` runs one job per
combination of the swept values, one after another, each in its own numbered folder under the
run folder (Hydra's basic sweeper's order: the last swept key varies fastest).

Sweep syntax is Hydra's: ``a,b,c``, ``range(0,3)``, ``choice(a,b)``; a list-typed key keeps its
list value (``run.profile_batches=[2,4]``) and a config group sweeps over options
(``algorithm=grpo,ppo``).
"""

from __future__ import annotations

import itertools
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from rlinf.workers.errors import ConfigError

__all__ = ["SweepJob", "expand_sweep", "sweep_jobs"]


@dataclass(frozen=True)
class SweepJob:
    """One job of a sweep: its number and its overrides."""

    index: int
    overrides: tuple[str, ...]
    """The job's overrides: the fixed ones and one value of each swept key."""
    swept: tuple[str, ...]
    """Only the swept ``key=value`` pairs (what tells this job from its siblings)."""

    def run_dir(self, base: Path) -> Path:
        """The job's run folder under the sweep's: ``base/<index>``."""
        return base / str(self.index)


def expand_sweep(overrides: Sequence[str]) -> list[tuple[tuple[str, ...], tuple[str, ...]]]:
    """Every combination of the swept values: ``(overrides, swept)`` per job.

    Raises:
        ConfigError: an override Hydra cannot parse.
    """
    from hydra.core.override_parser.overrides_parser import OverridesParser
    from hydra.errors import HydraException

    parser = OverridesParser.create()
    choices: list[list[tuple[str, bool]]] = []
    for arg in overrides:
        try:
            override = parser.parse_override(arg)
        except HydraException as exc:
            message = " ".join(str(exc).split())
            raise ConfigError(f"cannot parse the override {arg!r}: {message}") from exc
        if override.is_sweep_override():
            key = override.get_key_element()
            values = [f"{key}={value}" for value in override.sweep_string_iterator()]
            if not values:
                raise ConfigError(f"the sweep {arg!r} has no values")
            choices.append([(value, True) for value in values])
        else:
            choices.append([(arg, False)])
    jobs = []
    for combination in itertools.product(*choices):
        jobs.append((tuple(arg for arg, _ in combination),
                     tuple(arg for arg, swept in combination if swept)))
    return jobs


def sweep_jobs(overrides: Sequence[str]) -> list[SweepJob]:
    """The jobs of a sweep, numbered from 0.

    Raises:
        ConfigError: an unparsable override, or overrides that sweep nothing.
    """
    expanded = expand_sweep(overrides)
    if not any(swept for _, swept in expanded):
        raise ConfigError("--multirun needs at least one swept key, e.g. algorithm.lr=1e-4,3e-4 "
                          "(a comma-separated list of values)")
    return [SweepJob(index, job_overrides, swept)
            for index, (job_overrides, swept) in enumerate(expanded)]
