"""bench-embodied's peers (SB3, torchrl): timed iterations and the learning check's stop
rule, on a tiny setting. Each runs where its library is installed (the bench extra)."""

from __future__ import annotations

import math
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))


class _Busy:
    """A machine-busy clock that counts its reads: the CPU-seconds a peer reports are the
    reads between its first and its last timed iteration."""

    def __init__(self) -> None:
        self.reads = 0

    def __call__(self) -> float:
        self.reads += 1
        return float(self.reads)


def test_torchrl_times_each_iteration_on_both_collectors() -> None:
    pytest.importorskip("torchrl")
    from torchrl_ppo import TorchrlSetting, run_torchrl

    tiny = TorchrlSetting("InvertedPendulum-v5", num_envs=4, rollout_steps=16, epochs=2,
                          minibatch_size=32, width=16)
    for collector in ("serial", "multisync"):
        times, cpu = run_torchrl(tiny, collector, warmup=1, iterations=2, threads=1,
                                 busy_seconds=_Busy())
        assert len(times) == 2 and all(t > 0 for t in times)
        assert cpu == 1.0  # read once before and once after the timed iterations


def test_torchrl_stops_at_the_threshold_or_the_budget() -> None:
    pytest.importorskip("torchrl")
    from torchrl_ppo import TorchrlSetting, train_until

    # InvertedPendulum's episodes end within a few steps of a random start: 16 steps of 4
    # envs always end some, with a return of at least 1.
    tiny = TorchrlSetting("InvertedPendulum-v5", num_envs=4, rollout_steps=16, epochs=1,
                          minibatch_size=32, width=16)
    assert math.isfinite(train_until(tiny, "serial", threshold=1.0, budget_s=60, threads=1))
    assert train_until(tiny, "serial", threshold=1e9, budget_s=1.0, threads=1) == math.inf


def test_sb3_times_each_iteration_and_stops_at_the_threshold_or_the_budget() -> None:
    pytest.importorskip("stable_baselines3")
    from sb3_ppo import Sb3Setting, run_sb3, train_until

    tiny = Sb3Setting("InvertedPendulum-v5", num_envs=4, rollout_steps=16, epochs=1,
                      minibatches=2, width=16)
    times, cpu = run_sb3(tiny, "dummy", warmup=1, iterations=2, threads=1,
                         busy_seconds=_Busy())
    assert len(times) == 2 and all(t > 0 for t in times)
    assert cpu == 2.0  # read at each rollout's start: the 2 timed iterations, no warm-up
    reached = train_until(tiny, "dummy", threshold=1.0, budget_s=60, threads=1)
    assert math.isfinite(reached) and reached > 0
    assert train_until(tiny, "dummy", threshold=1e9, budget_s=1.0, threads=1) == math.inf
