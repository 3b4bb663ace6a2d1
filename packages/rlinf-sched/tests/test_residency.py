"""The switch rule shared by the simulator and the device lock."""

from __future__ import annotations

import pytest

from rlinf.sched.residency import Residency


def test_components_that_fit_together_stay_resident() -> None:
    r = Residency[str](100)
    assert r.admit("rollout", 40).onload
    assert r.admit("actor", 50).evict == ()
    again = r.admit("rollout", 40)
    assert not again.onload and again.evict == ()
    assert r.resident == ("actor", "rollout")


def test_a_component_that_does_not_fit_evicts_least_recently_used_first() -> None:
    r = Residency[str](100, [("a", 30), ("b", 30), ("c", 30)])
    plan = r.plan("d", 50)  # 90 + 50 > 100: a leaves (60 + 50 > 100), then b (30 + 50 fits)
    assert plan.onload and plan.evict == ("a", "b")
    assert r.resident == ("a", "b", "c")  # plan changes nothing
    r.commit(plan, 50)
    assert r.resident == ("c", "d")


def test_using_a_resident_refreshes_its_place_in_the_eviction_order() -> None:
    r = Residency[str](100, [("a", 40), ("b", 40)])
    r.admit("a", 40)
    assert r.admit("c", 40).evict == ("b",)


@pytest.mark.parametrize("capacity, memory", [(None, 10), (100, None)])
def test_unknown_sizes_mean_one_component_at_a_time(capacity: int | None,
                                                    memory: int | None) -> None:
    r = Residency[str](capacity, [("a", 10), ("b", 10)])
    assert r.plan("c", memory).evict == ("a", "b")


def test_a_resident_of_unknown_size_always_leaves() -> None:
    r = Residency[str](100, [("a", None), ("b", 10)])
    assert r.plan("c", 10).evict == ("a",)


def test_zero_memory_components_never_evict_and_are_never_evicted() -> None:
    r = Residency[str](100, [("sim", 0), ("policy", 90)])
    assert r.plan("reward", 0).evict == ()
    assert r.plan("actor", 90).evict == ("policy",)
    assert Residency[str](None, [("sim", 0)]).plan("actor", None).evict == ()


def test_discard_and_fits_together() -> None:
    r = Residency[str](100, [("a", None)])
    assert r.discard("a") and not r.discard("a")
    assert r.fits_together({"a": 50, "b": 50}) and not r.fits_together({"a": 60, "b": 50})
    assert Residency[str](None).fits_together({"a": None, "cpu": 0})
    assert not Residency[str](None).fits_together({"a": 1, "b": 1})
    with pytest.raises(ValueError, match="capacity"):
        Residency[str](-1)
