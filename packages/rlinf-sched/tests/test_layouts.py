"""Fixed layouts of the named modes, and the nesting rule of fixed placements."""

from __future__ import annotations

import pytest

from rlinf.sched import ExecutionMode, PlacementError, parse_placement
from rlinf.sched.layouts import check_nesting, disaggregated_layout, hybrid_layout

NAMES = ("rollout", "reward", "inference", "actor")


def test_hybrid_puts_one_component_apart_on_the_first_half() -> None:
    two = hybrid_layout(NAMES, 2, apart="rollout")
    assert two.mode is ExecutionMode.HYBRID
    assert two.to_spec() == "rollout: 0, reward,inference,actor: 1"
    five = hybrid_layout(NAMES, 5, apart="rollout")
    assert five.devices_of("rollout") == (0, 1, 2) and five.devices_of("actor") == (3, 4)
    with pytest.raises(PlacementError, match="at least 2 devices"):
        hybrid_layout(NAMES, 1, apart="rollout")
    with pytest.raises(PlacementError, match="'env' among the components"):
        hybrid_layout(NAMES, 2, apart="env")


def test_disaggregated_deals_spare_devices_to_the_heavy_components_in_turn() -> None:
    seven = disaggregated_layout(NAMES, 7, heavy=("rollout", "actor"))
    assert seven.mode is ExecutionMode.DISAGGREGATED
    assert seven.to_spec() == "rollout: 0-2, reward: 5, inference: 6, actor: 3-4"
    even = disaggregated_layout(("a", "b"), 4)
    assert len(even.devices_of("a")) == len(even.devices_of("b")) == 2
    with pytest.raises(PlacementError, match="a device for each of the 4 components"):
        disaggregated_layout(NAMES, 3, heavy=("rollout",))


def test_partly_overlapping_device_sets_are_refused() -> None:
    nested = parse_placement("rollout: 0-1, reward,inference,actor: 1", components=NAMES,
                             num_devices=2)
    check_nesting(nested)
    partial = parse_placement("rollout: 0-1, actor: 1-2, reward,inference: 0",
                              components=NAMES, num_devices=3)
    with pytest.raises(PlacementError, match=r"rollout \(0-1\) and actor \(1-2\) only partly"):
        check_nesting(partial)


def test_a_spec_names_its_highest_device_a_mode_none() -> None:
    from rlinf.sched.layouts import devices_named

    assert devices_named("rollout: 0, reward,inference,actor: 5-6", NAMES) == 7
    assert devices_named("hybrid", NAMES) == devices_named("auto", NAMES) == 0
    assert devices_named("rollout 0", NAMES) == 0  # placement checks say what is wrong
