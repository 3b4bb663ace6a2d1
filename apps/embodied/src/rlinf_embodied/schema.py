"""Typed conversion between plain mappings (from Hydra/OmegaConf) and frozen config dataclasses.

`from_mapping` walks a dataclass's fields by their type hints and rejects unknown keys, wrong
types and values outside a `Literal`, naming the dotted key, the value and what is allowed.
`field_docs` reads the one-line docstring under each field (the `--help` text), `to_dict`
goes back to plain data.
"""

from __future__ import annotations

import ast
import dataclasses
import inspect
import itertools
import textwrap
import types
import typing
from collections.abc import Iterator, Mapping
from typing import Any, TypeVar

from rlinf_embodied.errors import AppConfigError

__all__ = ["describe_fields", "field_docs", "from_mapping", "to_dict"]

T = TypeVar("T")


def _is_dataclass_type(tp: Any) -> bool:
    return isinstance(tp, type) and dataclasses.is_dataclass(tp)


def _type_name(tp: Any) -> str:
    origin = typing.get_origin(tp)
    if origin is typing.Literal:
        return " | ".join(repr(a) for a in typing.get_args(tp))
    if origin in (typing.Union, types.UnionType):
        return " | ".join(_type_name(a) for a in typing.get_args(tp))
    if origin is tuple:
        return f"list of {_type_name(typing.get_args(tp)[0])}"
    if tp is type(None):
        return "null"
    return getattr(tp, "__name__", str(tp))


def _convert(tp: Any, value: Any, key: str) -> Any:
    origin = typing.get_origin(tp)
    if _is_dataclass_type(tp):
        if not isinstance(value, Mapping):
            raise AppConfigError(key, value, f"a mapping of {tp.__name__} keys")
        return from_mapping(tp, value, prefix=f"{key}.")
    if origin in (typing.Union, types.UnionType):
        args = typing.get_args(tp)
        if value is None and type(None) in args:
            return None
        inner = [a for a in args if a is not type(None)]
        if len(inner) == 1:
            try:
                return _convert(inner[0], value, key)
            except AppConfigError:
                raise AppConfigError(key, value, _type_name(tp)) from None
        raise AppConfigError(key, value, _type_name(tp))  # pragma: no cover - unused shape
    if origin is typing.Literal:
        allowed = typing.get_args(tp)
        if value not in allowed or isinstance(value, bool) != isinstance(allowed[0], bool):
            raise AppConfigError(key, value, f"one of {list(allowed)}")
        return value
    if origin is tuple:
        (item, *_) = typing.get_args(tp)
        if isinstance(value, str | bytes) or not isinstance(value, list | tuple):
            raise AppConfigError(key, value, f"a list of {_type_name(item)}")
        return tuple(_convert(item, v, f"{key}[{i}]") for i, v in enumerate(value))
    if tp is bool:
        if not isinstance(value, bool):
            raise AppConfigError(key, value, "true or false")
        return value
    if tp is int:
        if isinstance(value, bool) or not isinstance(value, int):
            raise AppConfigError(key, value, "an integer")
        return value
    if tp is float:
        if isinstance(value, bool) or not isinstance(value, int | float):
            raise AppConfigError(key, value, "a number")
        return float(value)
    if tp is str:
        if not isinstance(value, str):
            raise AppConfigError(key, value, "a string")
        return value
    raise TypeError(f"unsupported config field type {tp!r} at {key!r}")  # pragma: no cover


def from_mapping(cls: type[T], data: Mapping[str, Any], *, prefix: str = "") -> T:
    """Build dataclass `cls` from `data`; missing keys take the field's default.

    Raises:
        AppConfigError: an unknown key, a value of the wrong type, or a missing required key.
    """
    if not _is_dataclass_type(cls):
        raise TypeError(f"{cls!r} is not a dataclass")
    hints = typing.get_type_hints(cls)
    fields = {f.name: f for f in dataclasses.fields(cls)}  # type: ignore[arg-type]
    unknown = [k for k in data if k not in fields]
    if unknown:
        key = f"{prefix}{unknown[0]}"
        raise AppConfigError(key, data[unknown[0]],
                             f"a known key; {prefix or 'the top level '}accepts "
                             f"{', '.join(sorted(fields))}")
    kwargs: dict[str, Any] = {}
    for name, f in fields.items():
        key = f"{prefix}{name}"
        if name in data:
            kwargs[name] = _convert(hints[name], data[name], key)
        elif f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING:
            raise AppConfigError(key, None, f"a value ({_type_name(hints[name])}); it is required")
    return cls(**kwargs)


def to_dict(obj: Any) -> dict[str, Any]:
    """Plain (JSON/YAML-ready) data of a config dataclass; tuples become lists."""

    def plain(value: Any) -> Any:
        if dataclasses.is_dataclass(value) and not isinstance(value, type):
            return {f.name: plain(getattr(value, f.name)) for f in dataclasses.fields(value)}
        if isinstance(value, tuple | list):
            return [plain(v) for v in value]
        return value

    result = plain(obj)
    if not isinstance(result, dict):
        raise TypeError(f"{obj!r} is not a dataclass instance")
    return result


def field_docs(cls: type) -> dict[str, str]:
    """The string literal that follows each field's annotation in the class body."""
    try:
        source = textwrap.dedent(inspect.getsource(cls))
    except (OSError, TypeError):  # pragma: no cover - no source (frozen apps)
        return {}
    body = ast.parse(source).body[0]
    docs: dict[str, str] = {}
    if not isinstance(body, ast.ClassDef):  # pragma: no cover
        return docs
    statements = body.body
    for stmt, nxt in itertools.pairwise(statements):
        if (isinstance(stmt, ast.AnnAssign) and isinstance(stmt.target, ast.Name)
                and isinstance(nxt, ast.Expr) and isinstance(nxt.value, ast.Constant)
                and isinstance(nxt.value.value, str)):
            docs[stmt.target.id] = " ".join(nxt.value.value.split())
    return docs


def describe_fields(cls: type, *, prefix: str = "") -> Iterator[tuple[str, str, Any, str]]:
    """``(dotted key, type, default, docstring)`` of every leaf field, depth first."""
    hints = typing.get_type_hints(cls)
    docs = field_docs(cls)
    for f in dataclasses.fields(cls):  # type: ignore[arg-type]
        tp = hints[f.name]
        key = f"{prefix}{f.name}"
        if _is_dataclass_type(tp):
            yield from describe_fields(tp, prefix=f"{key}.")
            continue
        if f.default is not dataclasses.MISSING:
            default: Any = f.default
        elif f.default_factory is not dataclasses.MISSING:
            default = f.default_factory()
        else:
            default = dataclasses.MISSING
        yield key, _type_name(tp), default, docs.get(f.name, "")
