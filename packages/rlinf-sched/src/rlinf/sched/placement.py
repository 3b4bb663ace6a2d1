"""Placement: which components run on which devices, and the compact syntax that says so.

A placement spec is a comma-separated list of entries. Each entry starts with one or more
component names followed by a colon, then a device set, then an optional processes-per-device
multiplier::

    spec     := "auto" | "collocated" | entry ((","|";") entry)*
    entry    := names ":" devices [procs]
    names    := NAME ("," NAME)*          NAME = letter or "_", then letters, digits, "_", ".", "-"
    devices  := item ("," item)*          item = INT | INT "-" INT   (inclusive range)
    procs    := "x" INT                   e.g. "x2" or "x 2": that many processes on each device

Commas are unambiguous because names start with a letter and device items with a digit: after
a comma, a digit continues the device set and a letter starts the next entry. Examples::

    actor,rollout: 0-7                    collocated: both time-share devices 0..7
    rollout: 0-5, actor: 6-7              disaggregated: disjoint device sets
    actor: 0-7, env: 0-3 x2, rollout: 4-7 hybrid; env runs 2 processes on each of 0..3
    rollout: 0-3,6, actor: 4,5,7          device sets with lists and ranges

The execution mode is derived, not written: every component on the same device set is
COLLOCATED, pairwise disjoint sets are DISAGGREGATED, anything else is HYBRID. `auto` leaves
the decision to the planner (a Placement with mode AUTO and no components); `collocated`
places every component on every device. `disaggregated` alone is not a placement (how to split
the devices is a planning decision): callers that accept it resolve it with the planner.
"""

from __future__ import annotations

import enum
import re
import types
from collections.abc import Collection, Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any

from rlinf.sched.errors import PlacementError

__all__ = [
    "ComponentPlacement",
    "ExecutionMode",
    "Placement",
    "derive_mode",
    "format_devices",
    "parse_placement",
]


class ExecutionMode(enum.Enum):
    """How components share devices (M2Flow's temporal / spatial / hybrid execution)."""

    COLLOCATED = "collocated"
    """All components on the same devices, taking turns (temporal multiplexing)."""
    DISAGGREGATED = "disaggregated"
    """Each component on its own devices, pipelined (spatial multiplexing)."""
    HYBRID = "hybrid"
    """Some components share devices, others run beside them."""
    AUTO = "auto"
    """The planner decides; the placement names no devices yet."""


def format_devices(devices: Iterable[int]) -> str:
    """Write a device set compactly, e.g. ``(0, 1, 2, 3, 6)`` → ``"0-3,6"``."""
    ordered = sorted(set(devices))
    parts: list[str] = []
    i = 0
    while i < len(ordered):
        j = i
        while j + 1 < len(ordered) and ordered[j + 1] == ordered[j] + 1:
            j += 1
        parts.append(str(ordered[i]) if i == j else f"{ordered[i]}-{ordered[j]}")
        i = j + 1
    return ",".join(parts)


@dataclass(frozen=True)
class ComponentPlacement:
    """Where one component runs: its devices and how many processes it starts on each."""

    component: str
    """Component name, e.g. ``"rollout"``."""
    devices: tuple[int, ...]
    """Global device indices, sorted and unique (any iterable is accepted and sorted)."""
    procs_per_device: int = 1
    """Processes (ranks) of this component on each of its devices."""

    def __post_init__(self) -> None:
        if not self.component or not _NAME_RE.fullmatch(self.component):
            raise PlacementError(
                f"invalid component name {self.component!r}: expected a letter or '_' "
                "followed by letters, digits, '_', '.' or '-'"
            )
        devices = tuple(int(d) for d in self.devices)
        if not devices:
            raise PlacementError(
                f"component {self.component!r} has an empty device set: "
                "expected at least one device"
            )
        if len(set(devices)) != len(devices):
            dupes = sorted({d for d in devices if devices.count(d) > 1})
            raise PlacementError(
                f"component {self.component!r} lists device(s) {format_devices(dupes)} more "
                "than once: expected each device at most once"
            )
        if min(devices) < 0:
            raise PlacementError(
                f"component {self.component!r} has negative device index {min(devices)}: "
                "expected indices >= 0"
            )
        if isinstance(self.procs_per_device, bool) or int(self.procs_per_device) < 1:
            raise PlacementError(
                f"component {self.component!r} has procs_per_device={self.procs_per_device!r}: "
                "expected an integer >= 1"
            )
        object.__setattr__(self, "devices", tuple(sorted(devices)))
        object.__setattr__(self, "procs_per_device", int(self.procs_per_device))

    @property
    def num_devices(self) -> int:
        """Number of devices this component uses."""
        return len(self.devices)

    @property
    def num_procs(self) -> int:
        """Total processes (ranks) of this component: devices × procs per device."""
        return len(self.devices) * self.procs_per_device

    def to_spec(self) -> str:
        """The entry of this component in a placement spec, e.g. ``"env: 0-3 x2"``."""
        procs = f" x{self.procs_per_device}" if self.procs_per_device != 1 else ""
        return f"{self.component}: {format_devices(self.devices)}{procs}"


def derive_mode(components: Iterable[ComponentPlacement]) -> ExecutionMode:
    """The mode implied by device sets: same → COLLOCATED, disjoint → DISAGGREGATED, else HYBRID.

    No components at all is AUTO (nothing is placed yet).
    """
    sets = [frozenset(c.devices) for c in components]
    if not sets:
        return ExecutionMode.AUTO
    if all(s == sets[0] for s in sets):
        return ExecutionMode.COLLOCATED
    seen: set[int] = set()
    for s in sets:
        if seen & s:
            return ExecutionMode.HYBRID
        seen |= s
    return ExecutionMode.DISAGGREGATED


@dataclass(frozen=True)
class Placement:
    """A validated placement of every component on a cluster of `num_devices` devices.

    `components` keeps the order the spec listed them in and is read-only. Construct it with
    `parse_placement` or `from_dict`; the constructor checks that devices lie in range and
    that `mode` matches the device sets (AUTO must have no components).
    """

    components: Mapping[str, ComponentPlacement]
    """Component name → its placement, in spec order."""
    mode: ExecutionMode
    """Derived execution mode."""
    num_devices: int
    """Devices in the cluster this placement was validated against."""
    _sharing: Mapping[int, tuple[str, ...]] = field(
        init=False, repr=False, compare=False, hash=False
    )

    def __post_init__(self) -> None:
        if isinstance(self.num_devices, bool) or int(self.num_devices) < 1:
            raise PlacementError(
                f"num_devices={self.num_devices!r}: expected a positive number of devices"
            )
        if not isinstance(self.mode, ExecutionMode):
            raise PlacementError(
                f"mode={self.mode!r}: expected one of {[m.value for m in ExecutionMode]}"
            )
        comps: dict[str, ComponentPlacement] = {}
        for name, cp in self.components.items():
            if not isinstance(cp, ComponentPlacement) or cp.component != name:
                raise PlacementError(
                    f"components[{name!r}] is {cp!r}: expected a ComponentPlacement whose "
                    f"component is {name!r}"
                )
            out_of_range = [d for d in cp.devices if d >= self.num_devices]
            if out_of_range:
                raise PlacementError(
                    f"component {name!r} uses device(s) {format_devices(out_of_range)} but the "
                    f"cluster has {self.num_devices} device(s): expected indices "
                    f"0-{self.num_devices - 1}"
                )
            comps[name] = cp
        derived = derive_mode(comps.values())
        if derived is not self.mode:
            raise PlacementError(
                f"mode {self.mode.value!r} does not match the device sets, which describe a "
                f"{derived.value!r} placement"
            )
        sharing: dict[int, list[str]] = {}
        for name, cp in comps.items():
            for d in cp.devices:
                sharing.setdefault(d, []).append(name)
        object.__setattr__(self, "components", types.MappingProxyType(comps))
        object.__setattr__(self, "num_devices", int(self.num_devices))
        object.__setattr__(
            self, "_sharing", types.MappingProxyType({d: tuple(n) for d, n in sharing.items()})
        )

    def __hash__(self) -> int:
        return hash((tuple(self.components.items()), self.mode, self.num_devices))

    def __reduce__(self) -> tuple[Any, ...]:
        # MappingProxyType does not pickle; rebuild from a plain dict (crosses Ray/processes).
        return (type(self), (dict(self.components), self.mode, self.num_devices))

    def __iter__(self) -> Iterator[ComponentPlacement]:
        return iter(self.components.values())

    @property
    def component_names(self) -> tuple[str, ...]:
        """Names of the placed components, in spec order."""
        return tuple(self.components)

    @property
    def used_devices(self) -> tuple[int, ...]:
        """Devices at least one component runs on, sorted."""
        return tuple(sorted(self._sharing))

    def devices_of(self, name: str) -> tuple[int, ...]:
        """The devices component `name` runs on; PlacementError if it is not placed."""
        return self._get(name).devices

    def procs_per_device(self, name: str) -> int:
        """How many processes component `name` starts on each of its devices."""
        return self._get(name).procs_per_device

    def sharing(self, device: int) -> tuple[str, ...]:
        """Components that run on `device`, in spec order (empty if the device is idle)."""
        if not 0 <= device < self.num_devices:
            raise PlacementError(
                f"device {device} is out of range: expected 0-{self.num_devices - 1}"
            )
        return self._sharing.get(device, ())

    def to_spec(self) -> str:
        """The compact spec; `parse_placement(p.to_spec(), ...)` gives back an equal Placement.

        Components with identical device sets and process counts are grouped in one entry
        (``"actor,rollout: 0-7"``).
        """
        if self.mode is ExecutionMode.AUTO:
            return "auto"
        groups: dict[tuple[tuple[int, ...], int], list[str]] = {}
        for cp in self.components.values():
            groups.setdefault((cp.devices, cp.procs_per_device), []).append(cp.component)
        entries = []
        for (devices, procs), names in groups.items():
            suffix = f" x{procs}" if procs != 1 else ""
            entries.append(f"{','.join(names)}: {format_devices(devices)}{suffix}")
        return ", ".join(entries)

    def to_dict(self) -> dict[str, Any]:
        """A JSON-friendly dict; `Placement.from_dict` reads it back."""
        return {
            "mode": self.mode.value,
            "num_devices": self.num_devices,
            "components": {
                name: {"devices": list(cp.devices), "procs_per_device": cp.procs_per_device}
                for name, cp in self.components.items()
            },
        }

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> Placement:
        """Read a dict written by `to_dict`, validating it as the constructor does."""
        try:
            mode = ExecutionMode(data["mode"])
            num_devices = int(data["num_devices"])
            raw = data["components"]
            comps = {
                str(name): ComponentPlacement(
                    str(name),
                    tuple(int(d) for d in entry["devices"]),
                    int(entry.get("procs_per_device", 1)),
                )
                for name, entry in raw.items()
            }
        except (KeyError, TypeError, ValueError, AttributeError) as exc:
            if isinstance(exc, PlacementError):
                raise
            raise PlacementError(
                f"invalid placement dict ({type(exc).__name__}: {exc}): expected "
                "{'mode': str, 'num_devices': int, 'components': {name: {'devices': [int, ...], "
                "'procs_per_device': int}}}"
            ) from exc
        return cls(comps, mode, num_devices)

    def _get(self, name: str) -> ComponentPlacement:
        try:
            return self.components[name]
        except KeyError:
            raise PlacementError(
                f"component {name!r} is not placed: expected one of {list(self.components)}"
            ) from None


# --------------------------------------------------------------------------------------------
# Parsing

_NAME_RE = re.compile(r"[A-Za-z_][A-Za-z0-9_.\-]*")
_TOKEN_RE = re.compile(
    r"\s*(?:(?P<int>\d+)|(?P<name>[A-Za-z_][A-Za-z0-9_.\-]*)|(?P<punct>[,;:\-*])|(?P<bad>\S))"
)
_PROCS_RE = re.compile(r"[xX](\d*)")


@dataclass(frozen=True)
class _Token:
    kind: str  # "int", "name", "punct", "end"
    text: str
    pos: int


def _tokenize(spec: str) -> list[_Token]:
    tokens: list[_Token] = []
    pos = 0
    while pos < len(spec):
        if spec[pos:].strip() == "":
            break
        m = _TOKEN_RE.match(spec, pos)
        if m is None:  # pragma: no cover - the pattern matches any non-space character
            break
        kind = m.lastgroup or "bad"
        start = m.start(kind)
        if kind == "bad":
            raise PlacementError(
                f"unexpected character {m.group(kind)!r} at position {start} in placement "
                f"{spec!r}: expected component names, ':', device numbers, '-', ',' or 'xN'"
            )
        tokens.append(_Token(kind, m.group(kind), start))
        pos = m.end()
    tokens.append(_Token("end", "", len(spec)))
    return tokens


class _Parser:
    """Recursive-descent parser for the grammar in the module docstring."""

    def __init__(self, spec: str) -> None:
        self.spec = spec
        self.tokens = _tokenize(spec)
        self.i = 0

    def peek(self, offset: int = 0) -> _Token:
        return self.tokens[min(self.i + offset, len(self.tokens) - 1)]

    def take(self) -> _Token:
        tok = self.peek()
        self.i += 1
        return tok

    def fail(self, tok: _Token, expected: str) -> PlacementError:
        found = "end of spec" if tok.kind == "end" else repr(tok.text)
        context = self.spec[max(0, tok.pos - 12) : tok.pos + 12]
        return PlacementError(
            f"bad placement syntax at position {tok.pos} (near {context!r}) in {self.spec!r}: "
            f"found {found}, expected {expected}"
        )

    def parse(self) -> list[tuple[list[str], list[int], int, str]]:
        entries = []
        while True:
            entries.append(self.entry())
            tok = self.peek()
            if tok.kind == "end":
                return entries
            if tok.text in (",", ";"):
                self.take()
                continue
            raise self.fail(tok, "',' or ';' before the next entry, or the end of the spec")

    def entry(self) -> tuple[list[str], list[int], int, str]:
        start = self.peek().pos
        names = [self.name()]
        while self.peek().text == ",":
            self.take()
            names.append(self.name())
        tok = self.take()
        if tok.text != ":":
            raise self.fail(tok, "':' after the component name(s), e.g. 'actor,rollout: 0-7'")
        if self.peek().kind != "int":
            tok = self.peek()
            found = "end of spec" if tok.kind == "end" else repr(tok.text)
            raise PlacementError(
                f"empty device set for {','.join(names)!r} in {self.spec!r} (found {found} "
                "after ':'): expected at least one device, e.g. '0-3' or '0,2,4'"
            )
        devices = [*self.item()]
        # After a comma, a digit continues the device set; a name starts the next entry.
        while self.peek().text == "," and self.peek(1).kind == "int":
            self.take()
            devices.extend(self.item())
        procs = self.procs()
        text = self.spec[start : self.peek().pos].strip().rstrip(",;").strip()
        return names, devices, procs, text

    def name(self) -> str:
        tok = self.take()
        if tok.kind != "name":
            raise self.fail(tok, "a component name (letters, digits, '_', '.', '-')")
        return tok.text

    def item(self) -> list[int]:
        tok = self.take()
        if tok.kind != "int":
            raise self.fail(tok, "a device index or range such as '0-3'")
        lo = int(tok.text)
        if self.peek().text != "-":
            return [lo]
        self.take()
        end = self.take()
        if end.kind != "int":
            raise self.fail(end, f"the last device of the range starting at {lo}")
        hi = int(end.text)
        if hi < lo:
            raise PlacementError(
                f"reversed device range '{lo}-{hi}' in {self.spec!r}: expected 'first-last' "
                f"with first <= last, e.g. '{hi}-{lo}'"
            )
        return list(range(lo, hi + 1))

    def procs(self) -> int:
        tok = self.peek()
        if tok.kind == "punct" and tok.text == "*":
            self.take()
            return self._procs_count(self.take())
        if tok.kind != "name":
            return 1
        m = _PROCS_RE.fullmatch(tok.text)
        if m is None:
            raise self.fail(tok, "'xN' (processes per device), ',' or the end of the spec")
        self.take()
        if m.group(1):
            count = int(m.group(1))
        else:
            return self._procs_count(self.take())
        return self._check_procs(count, tok)

    def _procs_count(self, tok: _Token) -> int:
        if tok.kind != "int":
            raise self.fail(tok, "the number of processes per device after 'x'")
        return self._check_procs(int(tok.text), tok)

    def _check_procs(self, count: int, tok: _Token) -> int:
        if count < 1:
            raise PlacementError(
                f"processes per device 'x{count}' in {self.spec!r}: expected at least x1"
            )
        return count


def parse_placement(
    spec: str,
    *,
    components: Collection[str],
    num_devices: int,
    mode: ExecutionMode | None = None,
) -> Placement:
    """Parse and validate a placement spec (grammar in the module docstring).

    Args:
        spec: e.g. ``"rollout: 0-5, actor: 6-7"``, ``"auto"`` or ``"collocated"``.
        components: every component of the workflow; each must be placed exactly once.
        num_devices: devices in the cluster; indices must lie in ``0..num_devices-1``.
        mode: if given, the mode the caller requires (e.g. DISAGGREGATED forbids overlapping
            device sets); AUTO requires the spec ``auto``.

    Raises:
        PlacementError: naming the problem, the offending text and what was expected.
    """
    names = list(components)
    if isinstance(num_devices, bool) or num_devices < 1:
        raise PlacementError(f"num_devices={num_devices!r}: expected at least one device")
    if not isinstance(spec, str) or not spec.strip():
        raise PlacementError(
            f"empty placement spec {spec!r}: expected 'auto', 'collocated' or entries like "
            "'rollout: 0-5, actor: 6-7'"
        )
    keyword = spec.strip().lower()
    if keyword == "auto":
        placement = Placement({}, ExecutionMode.AUTO, num_devices)
    elif keyword == "collocated":
        if not names:
            raise PlacementError("'collocated' needs at least one component: expected components")
        all_devices = tuple(range(num_devices))
        placement = Placement(
            {n: ComponentPlacement(n, all_devices) for n in names},
            ExecutionMode.COLLOCATED,
            num_devices,
        )
    elif keyword == "disaggregated":
        raise PlacementError(
            "'disaggregated' does not say which devices each component gets: expected explicit "
            "entries such as 'rollout: 0-5, actor: 6-7', or 'auto' to let the planner split them"
        )
    else:
        placement = _parse_entries(spec, names, num_devices)
    if mode is not None and mode is not placement.mode and mode is not ExecutionMode.HYBRID:
        raise PlacementError(_mode_mismatch(spec, mode, placement))
    if mode is ExecutionMode.HYBRID and placement.mode is ExecutionMode.AUTO:
        raise PlacementError(_mode_mismatch(spec, mode, placement))
    return placement


def _parse_entries(spec: str, names: list[str], num_devices: int) -> Placement:
    known = set(names)
    comps: dict[str, ComponentPlacement] = {}
    for entry_names, devices, procs, text in _Parser(spec).parse():
        if not devices:  # pragma: no cover - the grammar requires at least one item
            raise PlacementError(f"empty device set in {text!r}: expected e.g. '0-3'")
        for name in entry_names:
            if name not in known:
                raise PlacementError(
                    f"unknown component {name!r} in {text!r}: expected one of {names}"
                )
            if name in comps:
                raise PlacementError(
                    f"component {name!r} is placed twice (again in {text!r}): expected each "
                    "component in exactly one entry"
                )
            if len(set(devices)) != len(devices):
                dupes = sorted({d for d in devices if devices.count(d) > 1})
                raise PlacementError(
                    f"device(s) {format_devices(dupes)} listed more than once in {text!r}: "
                    "expected non-overlapping ranges within an entry"
                )
            bad = [d for d in devices if d >= num_devices]
            if bad:
                raise PlacementError(
                    f"device(s) {format_devices(bad)} out of range in {text!r}: the cluster has "
                    f"{num_devices} device(s), expected indices 0-{num_devices - 1}"
                )
            comps[name] = ComponentPlacement(name, tuple(devices), procs)
    missing = [n for n in names if n not in comps]
    if missing:
        raise PlacementError(
            f"component(s) {missing} missing from placement {spec!r}: expected every one of "
            f"{names} to be placed"
        )
    return Placement(comps, derive_mode(comps.values()), num_devices)


def _mode_mismatch(spec: str, wanted: ExecutionMode, got: Placement) -> str:
    overlaps = []
    items = list(got.components.values())
    for i, a in enumerate(items):
        for b in items[i + 1 :]:
            shared = set(a.devices) & set(b.devices)
            if shared and wanted is ExecutionMode.DISAGGREGATED:
                overlaps.append(f"{a.component} and {b.component} share {format_devices(shared)}")
            elif wanted is ExecutionMode.COLLOCATED and a.devices != b.devices:
                overlaps.append(
                    f"{a.component} is on {format_devices(a.devices)} but {b.component} on "
                    f"{format_devices(b.devices)}"
                )
    detail = f" ({'; '.join(overlaps)})" if overlaps else ""
    expectation = {
        ExecutionMode.COLLOCATED: "every component on the same device set",
        ExecutionMode.DISAGGREGATED: "pairwise disjoint device sets",
        ExecutionMode.HYBRID: "explicit device sets",
        ExecutionMode.AUTO: "the spec 'auto'",
    }[wanted]
    return (
        f"placement {spec!r} is {got.mode.value}{detail}: the caller requires "
        f"{wanted.value}, expected {expectation}"
    )
