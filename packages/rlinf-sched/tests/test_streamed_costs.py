from __future__ import annotations

import pytest

from rlinf.sched import ProfileError, StreamedCosts


class _Table:
    """A fixed part of 2 s per call plus 0.01 s per item per device; memory by items."""

    def time(self, component: str, *, batch_size: int, num_devices: int) -> float:
        return 2.0 + 0.01 * batch_size / num_devices

    def memory(self, component: str, *, batch_size: int, num_devices: int) -> int:
        return 100 * batch_size

    def switch_time(self, component: str) -> float:
        return 0.5


def test_a_piece_costs_its_share_of_the_whole_call() -> None:
    costs = StreamedCosts(_Table(), component="actor", whole=512)
    whole = 2.0 + 0.01 * 512
    assert costs.time("actor", batch_size=64, num_devices=1) == pytest.approx(whole / 8)
    # Eight pieces cost one whole call: the fixed part is paid once, not eight times.
    assert 8 * costs.time("actor", batch_size=64, num_devices=1) == pytest.approx(whole)
    assert costs.time("actor", batch_size=64, num_devices=2) == pytest.approx(
        (2.0 + 0.01 * 256) / 8)


def test_whole_calls_other_components_memory_and_switches_are_the_base_models() -> None:
    base = _Table()
    costs = StreamedCosts(base, component="actor", whole=512)
    assert costs.time("actor", batch_size=512, num_devices=1) == base.time(
        "actor", batch_size=512, num_devices=1)
    assert costs.time("rollout", batch_size=64, num_devices=1) == base.time(
        "rollout", batch_size=64, num_devices=1)
    assert costs.memory("actor", batch_size=64, num_devices=1) == 6400
    assert costs.switch_time("actor") == 0.5


def test_an_empty_iteration_is_refused() -> None:
    with pytest.raises(ProfileError, match="whole=0"):
        StreamedCosts(_Table(), component="actor", whole=0)
