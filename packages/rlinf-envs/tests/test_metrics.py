from __future__ import annotations

import pytest

from rlinf.envs.embodied import EpisodeStats
from rlinf.envs.metrics import StepRateMeter, mean_length, mean_return, success_rate, summarize

EPISODES = [
    EpisodeStats(env_index=0, episode_return=1.0, length=10, terminated=True, success=True),
    EpisodeStats(env_index=1, episode_return=3.0, length=20, terminated=False, success=False),
    EpisodeStats(env_index=0, episode_return=5.0, length=30, terminated=True, success=None),
]


def test_episode_metrics() -> None:
    assert success_rate(EPISODES) == 0.5  # the episode without a verdict does not count
    assert mean_return(EPISODES) == 3.0
    assert mean_length(EPISODES) == 20.0
    assert summarize(EPISODES) == {
        "episodes": 3.0, "mean_return": 3.0, "mean_length": 20.0, "success_rate": 0.5}


def test_empty_and_undefined() -> None:
    assert success_rate([]) is None and mean_return([]) is None and mean_length([]) is None
    assert summarize([]) == {"episodes": 0.0}
    assert success_rate(EPISODES[2:]) is None


def test_step_rate_meter_with_injected_clock() -> None:
    now = [100.0]
    meter = StepRateMeter(clock=lambda: now[0])
    assert meter.rate() == 0.0
    meter.add(8)
    meter.add(8)
    now[0] = 102.0
    assert meter.steps == 16 and meter.rate() == pytest.approx(8.0)
    meter.reset()
    assert meter.steps == 0 and meter.rate() == 0.0
