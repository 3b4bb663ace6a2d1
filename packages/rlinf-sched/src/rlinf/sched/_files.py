"""Reading JSON or YAML files that hold one mapping, and checking their values, with errors
that name the file (callers add it) and the key."""

from __future__ import annotations

import dataclasses
import json
import math
import numbers
import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

__all__ = ["load_mapping", "read_bool", "read_int", "read_number"]


def load_mapping(
    path: str | os.PathLike[str], *, error: type[Exception], what: str
) -> Mapping[str, Any]:
    """Read a JSON or YAML file holding a mapping, raising `error` with a clear message."""
    p = Path(path)
    try:
        text = p.read_text()
    except OSError as exc:
        raise error(f"cannot read {what} file {str(p)!r}: {exc}") from exc
    if p.suffix.lower() in (".yaml", ".yml"):
        try:
            import yaml
        except ImportError as exc:
            raise error(f"reading {str(p)!r} needs PyYAML: `pip install 'rlinf-sched[yaml]'`, "
                        "or write the file as JSON") from exc
        try:
            data = yaml.safe_load(text)
        except yaml.YAMLError as exc:
            raise error(f"{what} file {str(p)!r} is not valid YAML: {exc}") from exc
    else:
        try:
            data = json.loads(text)
        except json.JSONDecodeError as exc:
            raise error(f"{what} file {str(p)!r} is not valid JSON: {exc}") from exc
    if not isinstance(data, Mapping):
        raise error(f"{what} file {str(p)!r} holds {type(data).__name__}: expected a mapping")
    return data


def read_number(value: Any, where: str, *, error: type[Exception], positive: bool = False) -> float:
    """`value` as a finite float >= 0 (> 0 with `positive`); `error` names `where` otherwise.

    Numbers (numpy scalars too) and numeric strings are accepted (PyYAML reads ``30e9`` as a
    string); booleans, NaN and infinities are not.
    """
    number: float | None = None
    if isinstance(value, numbers.Real) and not isinstance(value, bool):
        number = float(value)
    elif isinstance(value, str):
        try:
            number = float(value)
        except ValueError:
            number = None
    bound = "> 0" if positive else ">= 0"
    if number is None or not math.isfinite(number) or number < 0 or (positive and number == 0):
        raise error(f"{where} is {value!r}: expected a finite number {bound}")
    return number


def read_int(value: Any, where: str, *, error: type[Exception], minimum: int = 1) -> int:
    """`value` as an int >= `minimum`; `error` names `where` otherwise.

    Integers, integral floats (``512.0``) and integer strings are accepted; booleans and
    fractions (``12.5``) are not.
    """
    number: int | None = None
    if (isinstance(value, numbers.Integral) and not isinstance(value, bool)) or (
            isinstance(value, float) and value.is_integer()):
        number = int(value)
    elif isinstance(value, str):
        try:
            number = int(value)
        except ValueError:
            number = None
    if number is None or number < minimum:
        raise error(f"{where} is {value!r}: expected an integer >= {minimum}")
    return number


def read_bool(value: Any, where: str, *, error: type[Exception]) -> bool:
    """`value` if it is a boolean; `error` names `where` otherwise (``"false"`` is not one)."""
    if not isinstance(value, bool):
        raise error(f"{where} is {value!r}: expected true or false")
    return value


def check_number_fields(instance: Any, what: str, *, error: type[Exception]) -> None:
    """Every field of the dataclass `instance` is a finite number >= 0 (not a bool);
    `error` names `what` and the field otherwise."""
    for f in dataclasses.fields(instance):
        value = getattr(instance, f.name)
        if not isinstance(value, int | float) or isinstance(value, bool) or value < 0 \
                or not math.isfinite(value):
            raise error(f"{what} {f.name}={value!r}: expected a finite number >= 0")
