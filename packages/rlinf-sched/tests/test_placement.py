"""Placement parsing: every mode, round trips, and every kind of invalid spec."""

from __future__ import annotations

import pickle

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from rlinf.sched import (
    ComponentPlacement,
    ExecutionMode,
    Placement,
    PlacementError,
    format_devices,
    parse_placement,
)

THREE = ("actor", "rollout", "env")


def parse(spec: str, components=("actor", "rollout"), num_devices: int = 8, **kw) -> Placement:
    return parse_placement(spec, components=components, num_devices=num_devices, **kw)


def test_collocated() -> None:
    p = parse("actor,rollout: 0-7")
    assert p.mode is ExecutionMode.COLLOCATED
    assert p.devices_of("actor") == p.devices_of("rollout") == tuple(range(8))
    assert p.sharing(3) == ("actor", "rollout")
    assert p.to_spec() == "actor,rollout: 0-7"


def test_disaggregated() -> None:
    p = parse("rollout: 0-5, actor: 6-7")
    assert p.mode is ExecutionMode.DISAGGREGATED
    assert p.devices_of("rollout") == (0, 1, 2, 3, 4, 5)
    assert p.devices_of("actor") == (6, 7)
    assert p.sharing(6) == ("actor",)
    assert p.component_names == ("rollout", "actor")


def test_hybrid_with_procs_per_device() -> None:
    p = parse("actor: 0-7, env: 0-3 x2, rollout: 4-7", components=THREE)
    assert p.mode is ExecutionMode.HYBRID
    assert p.sharing(0) == ("actor", "env")
    assert p.sharing(5) == ("actor", "rollout")
    assert p.components["env"].procs_per_device == 2
    assert p.components["env"].num_procs == 8
    assert p.procs_per_device("actor") == 1


@pytest.mark.parametrize(
    ("spec", "devices"),
    [
        ("actor: 0-3,6, rollout: 4,5,7", (0, 1, 2, 3, 6)),
        ("actor: 0,2,4, rollout: 1", (0, 2, 4)),
        ("actor:5;rollout:0-4", (5,)),
        ("  actor :  7 , rollout : 0 - 6  ", (7,)),
        ("actor: 6,0-3, rollout: 4-5", (0, 1, 2, 3, 6)),
    ],
)
def test_device_set_syntax(spec: str, devices: tuple[int, ...]) -> None:
    assert parse(spec).devices_of("actor") == devices


@pytest.mark.parametrize("spec", ["env: 0-3 x2", "env: 0-3 x 2", "env: 0-3x2", "env: 0-3 *2"])
def test_procs_syntax_variants(spec: str) -> None:
    p = parse(spec, components=("env",), num_devices=4)
    assert p.procs_per_device("env") == 2
    assert p.to_spec() == "env: 0-3 x2"


def test_auto_and_collocated_keywords() -> None:
    auto = parse("auto")
    assert auto.mode is ExecutionMode.AUTO
    assert auto.components == {}
    assert auto.to_spec() == "auto"
    col = parse("collocated", num_devices=4)
    assert col.mode is ExecutionMode.COLLOCATED
    assert col.devices_of("rollout") == (0, 1, 2, 3)


def test_single_component_on_all_devices_is_collocated() -> None:
    assert parse("actor: 0-3", components=("actor",)).mode is ExecutionMode.COLLOCATED


def test_idle_devices_are_allowed() -> None:
    p = parse("actor: 0, rollout: 1")
    assert p.sharing(5) == ()
    assert p.used_devices == (0, 1)


@pytest.mark.parametrize(
    "spec",
    [
        "actor,rollout,env: 0-7",
        "rollout: 0-5, actor: 6, env: 7",
        "actor: 0-7, env: 0-3 x2, rollout: 4-7",
        "rollout: 0-3,6, actor: 4,5,7, env: 0 x3",
        "actor,env: 0-1, rollout: 1-2 x4",
        "auto",
    ],
)
def test_round_trips(spec: str) -> None:
    p = parse(spec, components=THREE)
    assert parse(p.to_spec(), components=THREE) == p
    assert Placement.from_dict(p.to_dict()) == p
    clone = pickle.loads(pickle.dumps(p))
    assert clone == p
    assert hash(clone) == hash(p)


@st.composite
def placements(draw: st.DrawFn) -> tuple[Placement, list[str]]:
    num_devices = draw(st.integers(1, 24))
    names = draw(st.lists(st.sampled_from(["actor", "rollout", "env", "ref", "critic", "rm"]),
                          min_size=1, max_size=5, unique=True))
    comps = {}
    for n in names:
        devs = draw(st.sets(st.integers(0, num_devices - 1), min_size=1))
        comps[n] = ComponentPlacement(n, tuple(devs), draw(st.integers(1, 4)))
    from rlinf.sched.placement import derive_mode

    return Placement(comps, derive_mode(comps.values()), num_devices), names


@settings(max_examples=150, deadline=None)
@given(placements())
def test_random_placements_round_trip(drawn: tuple[Placement, list[str]]) -> None:
    p, names = drawn
    assert parse(p.to_spec(), components=names, num_devices=p.num_devices) == p
    for d in range(p.num_devices):
        assert set(p.sharing(d)) == {n for n in names if d in p.devices_of(n)}


def test_format_devices() -> None:
    assert format_devices([6, 0, 1, 2, 3]) == "0-3,6"
    assert format_devices([4]) == "4"
    assert format_devices([1, 3, 5]) == "1,3,5"


@pytest.mark.parametrize(
    ("spec", "kw", "fragments"),
    [
        (
            "actor: 0-3, critic: 4-7",
            {},
            ["unknown component 'critic'", "'critic: 4-7'", "expected one of"],
        ),
        ("actor: 0-3", {}, ["missing", "rollout", "expected every one"]),
        ("actor: 0-3, rollout: 4-8", {}, ["device(s) 8 out of range", "'rollout: 4-8'", "0-7"]),
        ("actor: 0-3, rollout: 7-4", {}, ["reversed device range '7-4'", "first <= last"]),
        ("actor:, rollout: 0", {}, ["empty device set for 'actor'", "at least one device"]),
        ("actor: 0, rollout:", {}, ["empty device set for 'rollout'", "end of spec"]),
        ("actor rollout: 0-7", {}, ["bad placement syntax", "'rollout'", "expected ':'"]),
        ("actor: 0-3 rollout: 4-7", {}, ["bad placement syntax", "'rollout'", "xN"]),
        ("actor: 0-3 y2, rollout: 4", {}, ["found 'y2'", "xN"]),
        ("actor: 0-3 x0, rollout: 4", {}, ["'x0'", "at least x1"]),
        ("actor: 0-3 x, rollout: 4", {}, ["found ','", "number of processes"]),
        ("actor: 0-3, rollout: 4-", {}, ["last device of the range starting at 4"]),
        ("actor: 0-3,2, rollout: 4", {}, ["device(s) 2 listed more than once", "'actor: 0-3,2'"]),
        ("actor: 0, rollout: 1, actor: 2", {}, ["placed twice", "'actor: 2'"]),
        ("actor: 0 # rollout: 1", {}, ["unexpected character '#'", "position 9"]),
        ("", {}, ["empty placement spec", "expected 'auto'"]),
        ("   ", {}, ["empty placement spec"]),
        ("disaggregated", {}, ["'disaggregated' does not say", "'auto'"]),
        ("0-3: actor", {}, ["bad placement syntax", "found '0'", "component name"]),
        (
            "actor: 0-3, rollout: 2-5",
            {"mode": ExecutionMode.DISAGGREGATED},
            ["is hybrid", "actor and rollout share 2-3", "requires disaggregated"],
        ),
        (
            "actor: 0-3, rollout: 4-7",
            {"mode": ExecutionMode.COLLOCATED},
            ["is disaggregated", "actor is on 0-3 but rollout on 4-7", "same device set"],
        ),
        ("actor,rollout: 0-7", {"mode": ExecutionMode.AUTO}, ["requires auto", "'auto'"]),
        ("auto", {"mode": ExecutionMode.HYBRID}, ["is auto", "requires hybrid"]),
    ],
)
def test_invalid_specs(spec: str, kw: dict, fragments: list[str]) -> None:
    with pytest.raises(PlacementError) as info:
        parse(spec, **kw)
    message = str(info.value)
    for fragment in fragments:
        assert fragment in message, (fragment, message)
    assert isinstance(info.value, ValueError)


def test_required_mode_accepts_matching_spec() -> None:
    p = parse("rollout: 0-5, actor: 6-7", mode=ExecutionMode.DISAGGREGATED)
    assert p.mode is ExecutionMode.DISAGGREGATED
    assert parse("actor: 0-7, rollout: 0-3", mode=ExecutionMode.HYBRID).mode is ExecutionMode.HYBRID


def test_bad_num_devices() -> None:
    with pytest.raises(PlacementError, match="num_devices=0"):
        parse("actor,rollout: 0", num_devices=0)


def test_placement_queries_reject_unknowns() -> None:
    p = parse("actor,rollout: 0-3")
    with pytest.raises(PlacementError, match="'critic' is not placed"):
        p.devices_of("critic")
    with pytest.raises(PlacementError, match="device 9 is out of range"):
        p.sharing(9)


def test_constructor_validation() -> None:
    cp = ComponentPlacement("actor", (3, 1, 2))
    assert cp.devices == (1, 2, 3)
    with pytest.raises(PlacementError, match="more than once"):
        ComponentPlacement("actor", (1, 1))
    with pytest.raises(PlacementError, match="empty device set"):
        ComponentPlacement("actor", ())
    with pytest.raises(PlacementError, match="procs_per_device=0"):
        ComponentPlacement("actor", (0,), 0)
    with pytest.raises(PlacementError, match="invalid component name"):
        ComponentPlacement("0actor", (0,))
    with pytest.raises(PlacementError, match="does not match the device sets"):
        Placement({"a": ComponentPlacement("a", (0,)), "b": ComponentPlacement("b", (1,))},
                  ExecutionMode.COLLOCATED, 2)
    with pytest.raises(PlacementError, match="cluster has 2 device"):
        Placement({"a": ComponentPlacement("a", (0, 5))}, ExecutionMode.COLLOCATED, 2)
    with pytest.raises(PlacementError, match="invalid placement dict"):
        Placement.from_dict({"mode": "collocated"})
    with pytest.raises(PlacementError, match="invalid placement dict"):
        Placement.from_dict({"mode": "sideways", "num_devices": 2, "components": {}})
    assert isinstance(p := parse("actor,rollout: 0"), Placement) and list(p) == list(
        p.components.values()
    )


def test_components_mapping_is_read_only() -> None:
    p = parse("actor,rollout: 0-1")
    with pytest.raises(TypeError):
        p.components["x"] = ComponentPlacement("x", (0,))  # type: ignore[index]


@settings(max_examples=300, deadline=None)
@given(st.text(alphabet="actorlnuvx0123456789,;:- *#\n", max_size=40))
def test_arbitrary_text_parses_or_raises_placement_error(spec: str) -> None:
    try:
        p = parse(spec, components=THREE)
    except PlacementError as exc:
        assert str(exc)
    else:
        assert parse(p.to_spec(), components=THREE) == p
