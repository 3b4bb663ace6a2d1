"""Parse an enum option written in a config as the enum itself or its string value."""

from __future__ import annotations

import enum
from typing import TypeVar

from rlinf.workers.errors import ConfigError

E = TypeVar("E", bound=enum.Enum)


def parse_config_enum(enum_cls: type[E], value: E | str, *, what: str) -> E:
    """`value` as a member of `enum_cls`; ConfigError naming `what` and the accepted values."""
    if isinstance(value, enum_cls):
        return value
    try:
        return enum_cls(value)
    except ValueError:
        accepted = [m.value for m in enum_cls]
        raise ConfigError(f"unknown {what} {value!r}; expected one of {accepted}") from None
