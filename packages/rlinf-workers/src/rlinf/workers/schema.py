"""Frozen config dataclasses from plain mappings (an app's OmegaConf containers, a
checkpoint's JSON), checked field by field, and back.

`build(cls, data)` turns a nested mapping into the dataclass `cls`, rejecting unknown keys,
missing required keys, values of the wrong type and values outside the `Range` a field is
annotated with; every error is an `rlinf.workers.errors.InvalidConfigError` naming the dotted
key, the value and what is allowed. `describe(cls)` lists every key with its type, default
and the one-line docstring written under the field (read from the source with `ast`), for
``--help``. `to_dict`, `flat_dict` and `nested` go back to plain data.

Supported field types: ``bool``, ``int``, ``float``, ``str``, ``Literal[...]``, ``X | None``,
``tuple[T, ...]`` and nested dataclasses, optionally wrapped in ``Annotated[T, Range(...)]``.
Hydra stays in the apps: this module reads plain mappings only.
"""

from __future__ import annotations

import ast
import dataclasses
import difflib
import functools
import inspect
import itertools
import math
import sys
import textwrap
import types
import typing
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, TypeVar

from rlinf.workers.errors import InvalidConfigError

__all__ = ["KeyInfo", "Range", "build", "build_composed", "describe", "field_docs",
           "flat_dict", "nested", "to_dict", "type_name"]

T = TypeVar("T")


@dataclass(frozen=True)
class Range:
    """Allowed interval of a numeric field (``None``: unbounded on that side)."""

    lo: float | None = None
    """Smallest allowed value."""
    hi: float | None = None
    """Largest allowed value."""
    lo_open: bool = False
    """Exclude `lo` itself (e.g. a learning rate must be > 0)."""

    def contains(self, value: float) -> bool:
        """Whether `value` lies in the interval."""
        if self.lo is not None and (value < self.lo or (self.lo_open and value == self.lo)):
            return False
        return self.hi is None or value <= self.hi

    def describe(self) -> str:
        """E.g. ``">= 1"``, ``"in (0, 1]"``."""
        if self.lo is not None and self.hi is not None:
            return f"in {'(' if self.lo_open else '['}{_num(self.lo)}, {_num(self.hi)}]"
        if self.lo is not None:
            return f"{'>' if self.lo_open else '>='} {_num(self.lo)}"
        if self.hi is not None:
            return f"<= {_num(self.hi)}"
        return "any value"


def _num(x: float) -> str:
    return str(int(x)) if float(x).is_integer() else repr(x)


@dataclass(frozen=True)
class KeyInfo:
    """One config key, for ``--help``."""

    key: str
    """Dotted path, e.g. ``rollout.group_size``."""
    type: str
    """Readable type, e.g. ``int >= 1``."""
    default: Any
    """Default value."""
    doc: str
    """The field's one-line docstring."""


@functools.cache
def field_docs(cls: type) -> dict[str, str]:
    """Field name → the string literal written right under it in the class body, or in the
    nearest base class that documents it (a subclass may declare a field again to change
    its default only)."""
    docs: dict[str, str] = {}
    for base in reversed(cls.__mro__[:-1]):
        docs.update(_own_field_docs(base))
    return docs


def _own_field_docs(cls: type) -> dict[str, str]:
    try:
        source = textwrap.dedent(inspect.getsource(cls))
    except (OSError, TypeError):
        return {}
    body = ast.parse(source).body[0]
    if not isinstance(body, ast.ClassDef):
        return {}
    docs: dict[str, str] = {}
    items = body.body
    for stmt, nxt in itertools.pairwise(items):
        if (isinstance(stmt, ast.AnnAssign) and isinstance(stmt.target, ast.Name)
                and isinstance(nxt, ast.Expr) and isinstance(nxt.value, ast.Constant)
                and isinstance(nxt.value.value, str)):
            docs[stmt.target.id] = " ".join(nxt.value.value.split())
    return docs


def _hints(cls: type) -> dict[str, Any]:
    return typing.get_type_hints(cls, include_extras=True)


def _unwrap(tp: Any) -> tuple[Any, Range | None]:
    if typing.get_origin(tp) is typing.Annotated:
        base, *extras = typing.get_args(tp)
        ranges = [e for e in extras if isinstance(e, Range)]
        return base, ranges[0] if ranges else None
    return tp, None


def _is_optional(tp: Any) -> tuple[bool, Any]:
    if typing.get_origin(tp) in (typing.Union, types.UnionType):
        args = [a for a in typing.get_args(tp) if a is not type(None)]
        if len(args) == 1 and len(typing.get_args(tp)) == 2:
            return True, args[0]
    return False, tp


def type_name(tp: Any) -> str:
    """Readable name of a field type, with its range: ``int >= 1``, ``'grpo' | 'ppo'``."""
    base, rng = _unwrap(tp)
    optional, inner = _is_optional(base)
    inner, inner_rng = _unwrap(inner)
    rng = rng or inner_rng
    if typing.get_origin(inner) is typing.Literal:
        name = " | ".join(repr(a) for a in typing.get_args(inner))
    elif typing.get_origin(inner) is tuple:
        name = f"list of {type_name(typing.get_args(inner)[0])}"
    elif isinstance(inner, type):
        name = inner.__name__
    else:
        name = str(inner)
    if rng is not None:
        name = f"{name} {rng.describe()}"
    return f"{name} | null" if optional else name


def _convert(value: Any, tp: Any, key: str) -> Any:
    base, rng = _unwrap(tp)
    optional, inner = _is_optional(base)
    if value is None:
        if optional:
            return None
        raise InvalidConfigError(key, value, type_name(tp) + " (null is not allowed)")
    inner, inner_rng = _unwrap(inner)
    rng = rng or inner_rng
    if dataclasses.is_dataclass(inner) and isinstance(inner, type):
        if not isinstance(value, Mapping):
            raise InvalidConfigError(key, value, f"a mapping of the {inner.__name__} keys")
        return build(inner, value, prefix=key)
    origin = typing.get_origin(inner)
    if origin is typing.Literal:
        allowed = typing.get_args(inner)
        if value not in allowed or isinstance(value, bool) != any(
                isinstance(a, bool) for a in allowed if a == value):
            raise InvalidConfigError(key, value, "one of " + ", ".join(map(repr, allowed)))
        return value
    if origin is tuple:
        item_tp = typing.get_args(inner)[0]
        if isinstance(value, str | bytes) or not isinstance(value, Sequence):
            raise InvalidConfigError(key, value, f"a list of {type_name(item_tp)}")
        return tuple(_convert(v, item_tp, f"{key}[{i}]") for i, v in enumerate(value))
    out = _scalar(value, inner, key, type_name(tp))
    if rng is not None and not rng.contains(out):
        raise InvalidConfigError(key, value, f"a value {rng.describe()}")
    return out


def _scalar(value: Any, tp: Any, key: str, expected: str) -> Any:
    if tp is bool:
        if isinstance(value, bool):
            return value
        expected = f"{expected} (true or false)"
    elif tp is int:
        if isinstance(value, int) and not isinstance(value, bool):
            return value
    elif tp is float:
        if isinstance(value, int | float) and not isinstance(value, bool):
            if math.isfinite(value):
                return float(value)
            expected = f"a finite {expected}"
    elif tp is str:
        if isinstance(value, str):
            return value
    else:  # pragma: no cover - a schema error, not a user error
        raise TypeError(f"unsupported config field type {tp!r} for {key}")
    raise InvalidConfigError(key, value, expected if expected.startswith("a finite")
                             else f"a value of type {expected}")


def build_composed(cls: type[T], cfg: Any) -> T:
    """`build` of a composed Hydra/OmegaConf config (interpolations resolved) or a plain
    nested mapping; an unresolvable interpolation or a root that is no mapping is an
    `InvalidConfigError`."""
    data = cfg
    omegaconf = sys.modules.get("omegaconf")  # a DictConfig comes from an imported omegaconf
    if omegaconf is not None and isinstance(cfg, omegaconf.DictConfig):
        from omegaconf.errors import OmegaConfBaseException

        try:
            data = omegaconf.OmegaConf.to_container(cfg, resolve=True)
        except OmegaConfBaseException as exc:
            key = getattr(exc, "full_key", None) or "?"
            raise InvalidConfigError(str(key), None, f"a resolvable value ({exc})") from exc
    if not isinstance(data, Mapping):
        names = ", ".join(f.name for f in dataclasses.fields(cls))  # type: ignore[arg-type]
        raise InvalidConfigError("<root>", data, f"a mapping of the sections {names}")
    return build(cls, {str(k): v for k, v in data.items()})


def build(cls: type[T], data: Mapping[str, Any], *, prefix: str = "") -> T:
    """`cls` from `data`; InvalidConfigError for unknown keys, wrong types, bad ranges.

    Keys missing from `data` take the field's default. A ``ValueError`` raised by the
    dataclass's own ``__post_init__`` (a cross-field rule) becomes an InvalidConfigError on
    the section.
    """
    if not dataclasses.is_dataclass(cls):  # pragma: no cover - a schema error
        raise TypeError(f"{cls!r} is not a dataclass")
    hints = _hints(cls)
    names = [f.name for f in dataclasses.fields(cls) if f.init]
    unknown = [k for k in data if k not in names]
    if unknown:
        where = f"{prefix}.{unknown[0]}" if prefix else str(unknown[0])
        section = f"section {prefix!r}" if prefix else "the top level"
        close = difflib.get_close_matches(str(unknown[0]), names, n=1)
        hint = f" (did you mean {close[0]!r}?)" if close else ""
        raise InvalidConfigError(where, data[unknown[0]],
                                 f"a known key{hint}; {section} has {', '.join(names)}")
    kwargs = {name: _convert(data[name], hints[name], f"{prefix}.{name}" if prefix else name)
              for name in names if name in data}
    for f in dataclasses.fields(cls):
        if f.init and f.name not in data and f.default is dataclasses.MISSING \
                and f.default_factory is dataclasses.MISSING:
            key = f"{prefix}.{f.name}" if prefix else f.name
            raise InvalidConfigError(key, None, f"a value of type {type_name(hints[f.name])}; "
                                     "it is required")
    try:
        return cls(**kwargs)
    except InvalidConfigError:
        raise
    except ValueError as exc:  # a cross-field check in __post_init__
        raise InvalidConfigError(prefix or cls.__name__, dict(data), str(exc)) from exc


def describe(cls: type, *, prefix: str = "") -> list[KeyInfo]:
    """Every leaf key of `cls` (nested sections flattened) with type, default and docstring."""
    out: list[KeyInfo] = []
    docs = field_docs(cls)
    hints = _hints(cls)
    for f in dataclasses.fields(cls):
        key = f"{prefix}.{f.name}" if prefix else f.name
        tp, _ = _unwrap(hints[f.name])
        if dataclasses.is_dataclass(tp) and isinstance(tp, type):
            out.extend(describe(tp, prefix=key))
            continue
        if f.default is not dataclasses.MISSING:
            default: Any = f.default
        elif f.default_factory is not dataclasses.MISSING:
            default = f.default_factory()
        else:
            default = dataclasses.MISSING
        out.append(KeyInfo(key, type_name(hints[f.name]), default, docs.get(f.name, "")))
    return out


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


def flat_dict(obj: Any) -> dict[str, Any]:
    """`to_dict` as one level of dotted keys (``{"run.seed": 0, ...}``)."""

    def flatten(data: Mapping[str, Any], prefix: str) -> Iterator[tuple[str, Any]]:
        for key, value in data.items():
            if isinstance(value, Mapping):
                yield from flatten(value, f"{prefix}{key}.")
            else:
                yield f"{prefix}{key}", value

    return dict(flatten(to_dict(obj), ""))


def nested(flat: Mapping[str, Any]) -> dict[str, Any]:
    """The inverse of `flat_dict`: dotted keys as nested mappings."""
    out: dict[str, Any] = {}
    for key, value in flat.items():
        *parents, leaf = key.split(".")
        node = out
        for part in parents:
            node = node.setdefault(part, {})
        node[leaf] = value
    return out
