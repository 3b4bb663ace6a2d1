"""The macro flow: an RL workflow as a graph of components and data edges.

A `Workflow` names what runs, not where: components (rollout, actor, inference, reward, env,
…), the data edges between them, how many items each component processes per iteration, and
iterative cycles such as the env ↔ rollout loop of embodied RL, which runs `steps` times per
iteration. The planner (`rlinf.sched.planner`) decides where and at what granularity.

File schema (JSON, or YAML with PyYAML installed)::

    name: grpo-math                     # optional
    global_batch: 512                   # required: items (sequences, env instances) per iteration
    components:
      - name: rollout                   # required, unique
        kind: rollout                   # optional (= name): rollout/actor/inference/reward/env/...
        resource: gpu                   # optional (gpu): "cpu" needs no device memory
        batch: 512                      # optional (global_batch): items per call of one step
        streaming: true                 # optional (false): one call, outputs emitted as they finish
        completion: [[0.5, 0.2], [1.0, 1.0]]  # optional: (fraction of items, fraction of call time)
        device_multiple: 2              # optional (1): device count must be a multiple (TP size)
        min_devices: 1                  # optional (1)
        max_devices: 64                 # optional (none)
        micro_batch_multiple: 16        # optional (1): micro-batches are whole units of this
        micro_batch_divides: true       # optional (false): micro-batches divide the batch
        whole_batch: true               # optional (false): always one call on the whole batch
        same_micro_batch_as: env        # optional: runs with that component's micro-batch
        split_evenly: true              # optional (false): device count divides micro-batches
        devices_divide: env             # optional: its device count divides that component's
        isolated: true                  # optional (false): processes of its own, never shared
    edges:
      - {src: rollout, dst: actor, bytes_per_item: 65536}      # items default to dst's batch
      - {src: rollout, dst: env, bytes_per_item: 64, feedback: true}   # step t → step t+1
    loops:
      - {components: [env, rollout], steps: 80}
"""

from __future__ import annotations

import math
import numbers
import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from rlinf.sched._files import load_mapping, read_bool, read_int, read_number
from rlinf.sched.errors import PlanningError

__all__ = ["Component", "Edge", "Loop", "Workflow", "WorkflowError", "staircase_completion"]


class WorkflowError(PlanningError):
    """A workflow description is malformed (unknown names, cycles without a loop, bad values)."""


def staircase_completion(steps: int) -> tuple[tuple[float, float], ...]:
    """The `Component.completion` of a streaming call that finishes its items in `steps`
    equal batches, each leaving together when it ends (e.g. a rollout generating its
    share in micro-batches): ``steps`` jumps, not a ramp."""
    jump = 1e-6  # batch i's items ramp up over this sliver, i.e. at once
    points: list[tuple[float, float]] = []
    for i in range(1, max(1, steps) + 1):
        points += [((i - 1) / steps + jump, i / steps), (i / steps, i / steps)]
    return tuple(points)


@dataclass(frozen=True)
class Component:
    """One component of the workflow (a worker group in the runtime)."""

    name: str
    """Unique name, used by placements and cost models."""
    kind: str = ""
    """What it is (rollout, actor, inference, reward, env, …); defaults to `name`."""
    resource: str = "gpu"
    """``"gpu"`` (needs device memory) or ``"cpu"`` (host work only, never forces a switch)."""
    batch: int | None = None
    """Items one call of one step processes; None means the workflow's `global_batch`."""
    streaming: bool = False
    """Process the whole batch in one call and emit items as they complete (elastic pipelining
    of long-tailed generation) instead of one call per micro-batch."""
    completion: tuple[tuple[float, float], ...] = ((1.0, 1.0),)
    """For streaming components: piecewise-linear (item fraction, time fraction) points, from
    (0, 0) implicitly to (1, 1); e.g. ((0.9, 0.4), (1.0, 1.0)) = 90% done at 40% of the call."""
    device_multiple: int = 1
    """The device count must be a multiple of this (tensor/pipeline parallel size)."""
    min_devices: int = 1
    """Fewest devices the component can run on (e.g. to hold its weights)."""
    max_devices: int | None = None
    """Most devices it can use; None for no limit."""
    micro_batch_multiple: int = 1
    """Micro-batches are whole multiples of this many items, the runtime's indivisible unit
    (e.g. one GRPO group), and every device gets at least one unit per call; divides the batch."""
    micro_batch_divides: bool = False
    """Micro-batches must divide the batch exactly (e.g. stage groups of equal size)."""
    whole_batch: bool = False
    """The runtime always makes one call on the whole batch (e.g. a trainer on the full rollout)."""
    same_micro_batch_as: str | None = None
    """Runs with the micro-batch of this component (e.g. a policy serving an env's stage groups)."""
    split_evenly: bool = False
    """Each call's items split evenly over its devices: the device count divides every
    micro-batch (e.g. env workers that each simulate an equal share of a stage group)."""
    devices_divide: str | None = None
    """Its device count divides this component's (e.g. policy processes that each serve
    whole env workers)."""
    isolated: bool = False
    """Runs in worker processes of its own even where other components share its devices (a
    simulator that may crash, an engine that wants its own process). Otherwise components
    placed on the same devices with as many processes share one process per rank
    (`rlinf.sched.process_sets`): they hand over turns and messages in-process."""

    def __post_init__(self) -> None:
        if not self.name or not isinstance(self.name, str):
            raise WorkflowError(f"component name {self.name!r}: expected a non-empty string")
        if not self.kind:
            object.__setattr__(self, "kind", self.name)
        if self.resource not in ("gpu", "cpu"):
            raise WorkflowError(
                f"component {self.name!r} has resource {self.resource!r}: expected 'gpu' or 'cpu'"
            )
        if self.batch is not None and not _is_int(self.batch, minimum=1):
            raise WorkflowError(
                f"component {self.name!r} has batch={self.batch!r}: expected an integer >= 1")
        if self.max_devices is not None and not _is_int(self.max_devices, minimum=1):
            raise WorkflowError(f"component {self.name!r} has max_devices={self.max_devices!r}: "
                                "expected an integer >= 1")
        for label, value in (("device_multiple", self.device_multiple),
                             ("min_devices", self.min_devices)):
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise WorkflowError(
                    f"component {self.name!r} has {label}={value!r}: expected an integer >= 1"
                )
        multiple = self.micro_batch_multiple
        if isinstance(multiple, bool) or not isinstance(multiple, int) or multiple < 1:
            raise WorkflowError(f"component {self.name!r} has micro_batch_multiple={multiple!r}: "
                                "expected an integer >= 1")
        if self.batch is not None and self.batch % multiple:
            raise WorkflowError(f"component {self.name!r} has batch={self.batch}, not a multiple "
                                f"of micro_batch_multiple={multiple}: expected whole units")
        for label, flag in (("micro_batch_divides", self.micro_batch_divides),
                            ("whole_batch", self.whole_batch),
                            ("split_evenly", self.split_evenly),
                            ("isolated", self.isolated)):
            if not isinstance(flag, bool):
                raise WorkflowError(f"component {self.name!r} has {label}={flag!r}: "
                                    "expected true or false")
        leader = self.same_micro_batch_as
        if leader is not None and (not isinstance(leader, str) or not leader
                                   or leader == self.name):
            raise WorkflowError(f"component {self.name!r} has same_micro_batch_as={leader!r}: "
                                "expected the name of another component")
        other = self.devices_divide
        if other is not None and (not isinstance(other, str) or not other or other == self.name):
            raise WorkflowError(f"component {self.name!r} has devices_divide={other!r}: "
                                "expected the name of another component")
        if leader is not None and self.streaming:
            raise WorkflowError(f"component {self.name!r} is streaming (one call per step) and "
                                f"cannot take the micro-batch of {leader!r}: drop one of them")
        if self.max_devices is not None and self.max_devices < self.min_devices:
            raise WorkflowError(
                f"component {self.name!r} has max_devices={self.max_devices} < "
                f"min_devices={self.min_devices}: expected max >= min"
            )
        points = tuple((float(f), float(t)) for f, t in self.completion)
        prev = (0.0, 0.0)
        for f, t in points:
            if not (prev[0] < f <= 1.0 and prev[1] <= t <= 1.0):
                raise WorkflowError(
                    f"component {self.name!r} has completion {list(self.completion)!r}: expected "
                    "(item fraction, time fraction) points increasing in (0, 1]"
                )
            prev = (f, t)
        if not points or points[-1] != (1.0, 1.0):
            raise WorkflowError(
                f"component {self.name!r} completion must end at (1.0, 1.0), got {points!r}"
            )
        object.__setattr__(self, "completion", points)

    def allows(self, num_devices: int) -> bool:
        """Whether the component may run on `num_devices` devices."""
        return (
            num_devices >= self.min_devices
            and num_devices % self.device_multiple == 0
            and (self.max_devices is None or num_devices <= self.max_devices)
        )

    def time_fraction(self, item_fraction: float) -> float:
        """Fraction of a streaming call's time by which `item_fraction` of its items are done."""
        prev_f, prev_t = 0.0, 0.0
        for f, t in self.completion:
            if item_fraction <= f + 1e-12:
                if f == prev_f:
                    return t
                return prev_t + (t - prev_t) * (item_fraction - prev_f) / (f - prev_f)
            prev_f, prev_t = f, t
        return 1.0


@dataclass(frozen=True)
class Edge:
    """Data flowing from `src` to `dst` every iteration (every step inside a loop)."""

    src: str
    dst: str
    bytes_per_item: float = 0.0
    """Payload bytes per item."""
    items: int | None = None
    """Items per iteration (per step in a loop); None means `dst`'s batch."""
    feedback: bool = False
    """A loop's back edge: `src` at step t feeds `dst` at step t+1."""
    lagged: bool = False
    """`dst` consumes what `src` produced one iteration before (a trainer one iteration
    behind its generators): the data is there when the iteration starts, so `dst` does not
    wait for `src`."""

    @property
    def key(self) -> str:
        """Stable identifier, ``"src->dst"``."""
        return f"{self.src}->{self.dst}"


@dataclass(frozen=True)
class Loop:
    """Components that repeat `steps` times per iteration (e.g. env ↔ rollout)."""

    components: tuple[str, ...]
    steps: int


@dataclass(frozen=True)
class Workflow:
    """Components, edges, loops and the global batch of one training iteration."""

    components: tuple[Component, ...]
    edges: tuple[Edge, ...] = ()
    global_batch: int = 1
    loops: tuple[Loop, ...] = ()
    name: str = ""
    _order: tuple[str, ...] = field(init=False, repr=False, compare=False, hash=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "components", tuple(self.components))
        object.__setattr__(self, "edges", tuple(self.edges))
        object.__setattr__(self, "loops", tuple(self.loops))
        if not _is_int(self.global_batch, minimum=1):
            raise WorkflowError(f"global_batch={self.global_batch!r}: expected an integer >= 1")
        if not self.components:
            raise WorkflowError("a workflow needs at least one component")
        names = [c.name for c in self.components]
        if len(set(names)) != len(names):
            raise WorkflowError(f"duplicate component names in {names}: expected unique names")
        known = set(names)
        for e in self.edges:
            for end in (e.src, e.dst):
                if end not in known:
                    raise WorkflowError(f"edge {e.key} names unknown component {end!r}: "
                                        f"expected one of {names}")
            if e.src == e.dst:
                raise WorkflowError(f"edge {e.key} is a self-loop: expected src != dst")
            if not _is_number(e.bytes_per_item) or (
                    e.items is not None and not _is_int(e.items, minimum=1)):
                raise WorkflowError(f"edge {e.key} has bytes_per_item={e.bytes_per_item!r}, "
                                    f"items={e.items!r}: expected a finite bytes_per_item >= 0 "
                                    "and an integer items >= 1")
        in_loop: dict[str, int] = {}
        for i, loop in enumerate(self.loops):
            if not _is_int(loop.steps, minimum=1) or not loop.components:
                raise WorkflowError(f"loop {i} {loop!r}: expected components and steps >= 1")
            for c in loop.components:
                if c not in known or c in in_loop:
                    raise WorkflowError(f"loop {i} names {c!r}, which is unknown or already in a "
                                        "loop: expected each component in at most one loop")
                in_loop[c] = i
        for e in self.edges:
            if e.feedback and (e.src not in in_loop or in_loop.get(e.dst) != in_loop[e.src]):
                raise WorkflowError(f"feedback edge {e.key} must join two components of one loop")
            if e.lagged and (e.feedback or e.dst in in_loop):
                raise WorkflowError(f"lagged edge {e.key} must feed a component outside any "
                                    "loop and not be a feedback edge")
        self._check_micro_batch_rules()
        object.__setattr__(self, "_order", self._topological_order(names, in_loop))

    def _check_micro_batch_rules(self) -> None:
        """Units divide each batch; `same_micro_batch_as` names a splittable component with
        the same batch that follows no other."""
        for c in self.components:
            batch = self.batch_of(c.name)
            if batch % c.micro_batch_multiple:
                raise WorkflowError(
                    f"component {c.name!r} has batch {batch}, not a multiple of "
                    f"micro_batch_multiple={c.micro_batch_multiple}: expected whole units")
            if c.devices_divide is not None and c.devices_divide not in self.names:
                raise WorkflowError(
                    f"component {c.name!r} has devices_divide={c.devices_divide!r}, an unknown "
                    f"component: expected one of {list(self.names)}")
            if c.same_micro_batch_as is None:
                continue
            if c.same_micro_batch_as not in self.names:
                raise WorkflowError(
                    f"component {c.name!r} has same_micro_batch_as={c.same_micro_batch_as!r}, "
                    f"an unknown component: expected one of {list(self.names)}")
            leader = self.component(c.same_micro_batch_as)
            if leader.same_micro_batch_as is not None or leader.streaming:
                raise WorkflowError(
                    f"component {c.name!r} takes the micro-batch of {leader.name!r}, which "
                    "itself follows another or streams: name a component with its own "
                    "micro-batch")
            if self.batch_of(leader.name) != batch:
                raise WorkflowError(
                    f"component {c.name!r} (batch {batch}) takes the micro-batch of "
                    f"{leader.name!r} (batch {self.batch_of(leader.name)}): expected equal "
                    "batches")

    def _topological_order(self, names: list[str], in_loop: Mapping[str, int]) -> tuple[str, ...]:
        preds: dict[str, set[str]] = {n: set() for n in names}
        for e in self.edges:
            if not e.feedback:
                preds[e.dst].add(e.src)
        order: list[str] = []
        placed: set[str] = set()
        while len(order) < len(names):
            ready = [n for n in names if n not in placed and preds[n] <= placed]
            if not ready:
                stuck = [n for n in names if n not in placed]
                raise WorkflowError(f"components {stuck} form a cycle: mark the edge that feeds "
                                    "the next step as feedback: true inside a loop")
            nxt = ready[0]
            if nxt in in_loop:  # keep a loop's members contiguous, in dependency order
                members = [n for n in names if in_loop.get(n) == in_loop[nxt]]
                while any(m not in placed for m in members):
                    step = [m for m in members if m not in placed and preds[m] <= placed]
                    if not step:
                        raise WorkflowError(f"loop {members} depends on a component outside it "
                                            "that itself depends on the loop")
                    order.append(step[0])
                    placed.add(step[0])
                continue
            order.append(nxt)
            placed.add(nxt)
        return tuple(order)

    # ------------------------------------------------------------------ queries
    @property
    def names(self) -> tuple[str, ...]:
        """Component names in declaration order."""
        return tuple(c.name for c in self.components)

    @property
    def order(self) -> tuple[str, ...]:
        """Component names in dependency order (loop members contiguous)."""
        return self._order

    def component(self, name: str) -> Component:
        """The component called `name`; WorkflowError if there is none."""
        for c in self.components:
            if c.name == name:
                return c
        raise WorkflowError(f"unknown component {name!r}: expected one of {list(self.names)}")

    def batch_of(self, name: str) -> int:
        """Items per call of one step of component `name`."""
        c = self.component(name)
        return c.batch if c.batch is not None else self.global_batch

    def micro_batch_group(self, name: str) -> tuple[str, ...]:
        """The components that share `name`'s micro-batch (`same_micro_batch_as`), the one
        that owns it first; just ``(name,)`` for most components."""
        c = self.component(name)
        leader = c.same_micro_batch_as or c.name
        followers = [o.name for o in self.components if o.same_micro_batch_as == leader]
        return (leader, *followers)

    def steps_of(self, name: str) -> int:
        """How many times the component runs per iteration (its loop's steps, else 1)."""
        for loop in self.loops:
            if name in loop.components:
                return loop.steps
        return 1

    def loop_of(self, name: str) -> int | None:
        """Index of the loop the component belongs to, or None."""
        for i, loop in enumerate(self.loops):
            if name in loop.components:
                return i
        return None

    def inputs(self, name: str) -> tuple[Edge, ...]:
        """Edges into `name` (feedback edges included)."""
        return tuple(e for e in self.edges if e.dst == name)

    def edge_items(self, edge: Edge) -> int:
        """Items the edge carries per iteration (per step in a loop)."""
        return edge.items if edge.items is not None else self.batch_of(edge.dst)

    # ------------------------------------------------------------------ files
    def to_dict(self) -> dict[str, Any]:
        """The file schema in the module docstring."""
        comps = []
        for c in self.components:
            entry: dict[str, Any] = {"name": c.name, "kind": c.kind, "resource": c.resource}
            if c.batch is not None:
                entry["batch"] = c.batch
            if c.streaming:
                entry["streaming"] = True
                entry["completion"] = [list(p) for p in c.completion]
            entry.update(device_multiple=c.device_multiple, min_devices=c.min_devices)
            if c.max_devices is not None:
                entry["max_devices"] = c.max_devices
            if c.micro_batch_multiple != 1:
                entry["micro_batch_multiple"] = c.micro_batch_multiple
            if c.micro_batch_divides:
                entry["micro_batch_divides"] = True
            if c.whole_batch:
                entry["whole_batch"] = True
            if c.same_micro_batch_as is not None:
                entry["same_micro_batch_as"] = c.same_micro_batch_as
            if c.split_evenly:
                entry["split_evenly"] = True
            if c.devices_divide is not None:
                entry["devices_divide"] = c.devices_divide
            if c.isolated:
                entry["isolated"] = True
            comps.append(entry)
        edges = []
        for e in self.edges:
            entry = {"src": e.src, "dst": e.dst, "bytes_per_item": e.bytes_per_item}
            if e.items is not None:
                entry["items"] = e.items
            if e.feedback:
                entry["feedback"] = True
            if e.lagged:
                entry["lagged"] = True
            edges.append(entry)
        return {
            "name": self.name,
            "global_batch": self.global_batch,
            "components": comps,
            "edges": edges,
            "loops": [{"components": list(lp.components), "steps": lp.steps}
                      for lp in self.loops],
        }

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> Workflow:
        """Build a workflow from the file schema; WorkflowError names what is wrong."""
        if not isinstance(data, Mapping):
            raise WorkflowError(
                f"workflow description is {type(data).__name__}: expected a mapping")
        unknown = set(data) - {"name", "global_batch", "components", "edges", "loops"}
        if unknown:
            raise WorkflowError(f"unknown workflow key(s) {sorted(unknown)}")
        _check_values(data)
        try:
            comps = [_component(c) for c in _list(data, "components")]
            edges = [Edge(src=str(e["src"]), dst=str(e["dst"]),
                          bytes_per_item=float(e.get("bytes_per_item", 0.0)),
                          items=None if e.get("items") is None else int(e["items"]),
                          feedback=bool(e.get("feedback", False)),
                          lagged=bool(e.get("lagged", False)))
                     for e in _list(data, "edges", required=False)]
            loops = [Loop(tuple(str(c) for c in lp["components"]), int(lp["steps"]))
                     for lp in _list(data, "loops", required=False)]
            global_batch = int(data["global_batch"])
        except (KeyError, TypeError, ValueError) as exc:
            if isinstance(exc, WorkflowError):
                raise
            raise WorkflowError(f"invalid workflow ({type(exc).__name__}: {exc}): see the schema "
                                "in rlinf.sched.workflow") from exc
        return cls(tuple(comps), tuple(edges), global_batch, tuple(loops),
                   str(data.get("name", "")))

    @classmethod
    def from_file(cls, path: str | os.PathLike[str]) -> Workflow:
        """Read a JSON or YAML (``.yaml``/``.yml``) workflow file; WorkflowError names the file
        and the key (e.g. ``components[1].batch``) of a bad value."""
        data = load_mapping(path, error=WorkflowError, what="workflow")
        try:
            return cls.from_dict(data)
        except WorkflowError as exc:
            raise WorkflowError(f"in workflow file {str(path)!r}: {exc}") from exc


def _component(entry: Any) -> Component:
    if not isinstance(entry, Mapping) or "name" not in entry:
        raise WorkflowError(f"component entry {entry!r}: expected a mapping with a 'name'")
    known = {"name", "kind", "resource", "batch", "streaming", "completion", "device_multiple",
             "min_devices", "max_devices", "micro_batch_multiple", "micro_batch_divides",
             "whole_batch", "same_micro_batch_as", "split_evenly", "devices_divide",
             "isolated"}
    unknown = set(entry) - known
    if unknown:
        raise WorkflowError(f"component {entry['name']!r} has unknown key(s) {sorted(unknown)}: "
                            f"expected {sorted(known)}")
    completion = entry.get("completion", [[1.0, 1.0]])
    return Component(
        name=str(entry["name"]), kind=str(entry.get("kind", "")),
        resource=str(entry.get("resource", "gpu")),
        batch=None if entry.get("batch") is None else int(entry["batch"]),
        streaming=bool(entry.get("streaming", False)),
        completion=tuple((float(f), float(t)) for f, t in completion),
        device_multiple=int(entry.get("device_multiple", 1)),
        min_devices=int(entry.get("min_devices", 1)),
        max_devices=None if entry.get("max_devices") is None else int(entry["max_devices"]),
        micro_batch_multiple=int(entry.get("micro_batch_multiple", 1)),
        micro_batch_divides=bool(entry.get("micro_batch_divides", False)),
        whole_batch=bool(entry.get("whole_batch", False)),
        same_micro_batch_as=None if entry.get("same_micro_batch_as") is None
        else str(entry["same_micro_batch_as"]),
        split_evenly=bool(entry.get("split_evenly", False)),
        devices_divide=None if entry.get("devices_divide") is None
        else str(entry["devices_divide"]),
        isolated=bool(entry.get("isolated", False)),
    )


def _list(data: Mapping[str, Any], key: str, *, required: bool = True) -> Sequence[Any]:
    if key not in data:
        if required:
            raise WorkflowError(f"workflow has no {key!r}: expected a list of {key}")
        return []
    value = data[key]
    if not isinstance(value, list):
        raise WorkflowError(f"workflow {key!r} is {type(value).__name__}: expected a list")
    return value


# numbers.Integral/Real: numpy scalars are welcome in code, booleans are not counts.
def _is_int(value: Any, *, minimum: int) -> bool:
    return (isinstance(value, numbers.Integral) and not isinstance(value, bool)
            and int(value) >= minimum)


def _is_number(value: Any) -> bool:
    return (isinstance(value, numbers.Real) and not isinstance(value, bool)
            and math.isfinite(value) and float(value) >= 0)


# Value checks of the file schema, by key: the least integer ("int", n), a finite number >= 0
# ("number", 0), or a boolean ("bool", 0). Optional integers may also be null.
_COMPONENT_VALUES = {
    "batch": ("int", 1), "device_multiple": ("int", 1), "min_devices": ("int", 1),
    "max_devices": ("int", 1), "micro_batch_multiple": ("int", 1), "streaming": ("bool", 0),
    "micro_batch_divides": ("bool", 0), "whole_batch": ("bool", 0), "split_evenly": ("bool", 0),
    "isolated": ("bool", 0),
}
_EDGE_VALUES = {"bytes_per_item": ("number", 0), "items": ("int", 1), "feedback": ("bool", 0),
                "lagged": ("bool", 0)}
_LOOP_VALUES = {"steps": ("int", 1)}


def _check_values(data: Mapping[str, Any]) -> None:
    """Refuse a bad number or flag in a workflow document, naming its key (e.g.
    ``components[1].batch``); structure (lists, names, unknown keys) is checked later."""
    if "global_batch" not in data:
        raise WorkflowError("workflow has no 'global_batch': expected an integer >= 1")
    read_int(data["global_batch"], "global_batch", error=WorkflowError)
    for key, checks in (("components", _COMPONENT_VALUES), ("edges", _EDGE_VALUES),
                        ("loops", _LOOP_VALUES)):
        entries = data.get(key)
        for i, entry in enumerate(entries if isinstance(entries, list) else []):
            if not isinstance(entry, Mapping):
                continue
            for name, (kind, minimum) in checks.items():
                value, where = entry.get(name), f"{key}[{i}].{name}"
                if kind == "bool" and name in entry:
                    read_bool(value, where, error=WorkflowError)
                elif kind == "number" and name in entry:
                    read_number(value, where, error=WorkflowError)
                elif kind == "int" and value is not None:
                    read_int(value, where, error=WorkflowError, minimum=minimum)
            points = entry.get("completion") if key == "components" else None
            for j, point in enumerate(points if isinstance(points, list) else []):
                if not (isinstance(point, list | tuple) and len(point) == 2 and all(
                        _is_number(x) and x <= 1 for x in point)):
                    raise WorkflowError(f"components[{i}].completion[{j}] is {point!r}: expected "
                                        "an [item fraction, time fraction] pair in [0, 1]")
