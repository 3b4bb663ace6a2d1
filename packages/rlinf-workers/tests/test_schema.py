"""`rlinf.workers.schema`: config dataclasses from plain mappings and back, every refusal
naming the dotted key, the value and what is allowed."""

from __future__ import annotations

import pickle
from dataclasses import dataclass, field
from typing import Annotated, Literal

import pytest

from rlinf.workers.errors import ConfigError, InvalidConfigError
from rlinf.workers.schema import Range, build, describe, flat_dict, nested, to_dict


@dataclass(frozen=True)
class Inner:
    width: Annotated[int, Range(lo=1)] = 8
    """Units per layer."""
    rate: Annotated[float, Range(lo=0, lo_open=True)] = 0.1
    """A learning rate."""


@dataclass(frozen=True)
class Outer:
    name: Literal["ppo", "grpo"] = "ppo"
    """The algorithm."""
    sizes: tuple[int, ...] = (4, 4)
    """Layer sizes."""
    path: str | None = None
    """Where to write."""
    trace: bool = False
    """Record spans."""
    inner: Inner = field(default_factory=Inner)
    """A nested section."""

    def __post_init__(self) -> None:
        if self.name == "grpo" and len(self.sizes) < 2:
            raise ValueError("grpo needs two sizes")


@dataclass(frozen=True)
class Required:
    seed: int
    """No default."""


@pytest.mark.parametrize(("data", "key", "allowed"), [
    ({"nmae": "ppo"}, "nmae", "the top level has name, sizes, path, trace, inner"),
    ({"inner": {"widht": 3}}, "inner.widht", "section 'inner' has width, rate"),
    ({"name": "sac"}, "name", "one of 'ppo', 'grpo'"),
    ({"sizes": "4,4"}, "sizes", "a list of int"),
    ({"sizes": [4, "x"]}, "sizes[1]", "a value of type int"),
    ({"trace": "yes"}, "trace", "a value of type bool (true or false)"),
    ({"trace": 1}, "trace", "type bool"),
    ({"inner": {"width": 0}}, "inner.width", "a value >= 1"),
    ({"inner": {"rate": 0}}, "inner.rate", "a value > 0"),
    ({"inner": {"rate": float("inf")}}, "inner.rate", "a finite float > 0"),
    ({"inner": 3}, "inner", "a mapping of the Inner keys"),
    ({"name": "grpo", "sizes": [4]}, "Outer", "grpo needs two sizes"),
])
def test_a_bad_value_names_key_value_and_allowed(data: dict[str, object], key: str,
                                                 allowed: str) -> None:
    with pytest.raises(InvalidConfigError) as info:
        build(Outer, data)
    assert info.value.key == key and allowed in str(info.value), str(info.value)
    assert isinstance(info.value, ConfigError) and isinstance(info.value, ValueError)
    again = pickle.loads(pickle.dumps(info.value))
    assert (again.key, str(again)) == (key, str(info.value))


def test_a_required_key_must_be_given() -> None:
    with pytest.raises(InvalidConfigError, match=r"'seed' = None .* it is required"):
        build(Required, {})
    assert build(Required, {"seed": 3}).seed == 3


def test_plain_data_round_trips() -> None:
    cfg = build(Outer, {"sizes": [8, 2], "path": "/tmp/x", "inner": {"rate": 2}})
    assert cfg.sizes == (8, 2) and cfg.inner.rate == 2.0 and isinstance(cfg.inner.rate, float)
    assert to_dict(cfg)["sizes"] == [8, 2]
    flat = flat_dict(cfg)
    assert flat["inner.width"] == 8 and flat["sizes"] == [8, 2]
    assert build(Outer, nested(flat)) == cfg


def test_describe_lists_every_leaf_with_its_type_default_and_docstring() -> None:
    keys = {info.key: info for info in describe(Outer)}
    assert list(keys) == ["name", "sizes", "path", "trace", "inner.width", "inner.rate"]
    assert keys["inner.width"].type == "int >= 1" and keys["inner.width"].default == 8
    assert keys["inner.rate"].doc == "A learning rate."
    assert keys["path"].type == "str | null"
