"""Rollout metrics: success rate, returns, env throughput."""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence

from rlinf.envs.embodied.base import EpisodeStats


def success_rate(episodes: Sequence[EpisodeStats]) -> float | None:
    """Share of episodes that succeeded, over those whose task reports success.

    None when no episode reports success (e.g. MuJoCo locomotion) or there are none.
    """
    judged = [e.success for e in episodes if e.success is not None]
    return sum(judged) / len(judged) if judged else None


def mean_return(episodes: Sequence[EpisodeStats]) -> float | None:
    """Mean undiscounted episode return; None for no episodes."""
    return sum(e.episode_return for e in episodes) / len(episodes) if episodes else None


def mean_length(episodes: Sequence[EpisodeStats]) -> float | None:
    """Mean episode length in steps; None for no episodes."""
    return sum(e.length for e in episodes) / len(episodes) if episodes else None


def summarize(episodes: Sequence[EpisodeStats]) -> dict[str, float]:
    """`episodes`, `mean_return`, `mean_length`, `success_rate` (only those defined)."""
    summary: dict[str, float] = {"episodes": float(len(episodes))}
    for key, value in (("mean_return", mean_return(episodes)),
                       ("mean_length", mean_length(episodes)),
                       ("success_rate", success_rate(episodes))):
        if value is not None:
            summary[key] = value
    return summary


class StepRateMeter:
    """Env steps per second over a window: `add(n)` after each batched step, `rate()` to read.

    `clock` is injectable so tests need not sleep.
    """

    def __init__(self, *, clock: Callable[[], float] = time.perf_counter) -> None:
        self._clock = clock
        self._start = clock()
        self._steps = 0

    def add(self, steps: int) -> None:
        """Count `steps` env steps (num_envs for one batched step)."""
        self._steps += steps

    @property
    def steps(self) -> int:
        """Env steps counted since the last reset."""
        return self._steps

    def rate(self) -> float:
        """Env steps per second since construction or the last `reset()`."""
        elapsed = self._clock() - self._start
        return self._steps / elapsed if elapsed > 0 else 0.0

    def reset(self) -> None:
        """Start a new window."""
        self._start = self._clock()
        self._steps = 0
