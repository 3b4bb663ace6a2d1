"""Analytic cost models: closed-form time and memory curves, and loading cost files.

`AnalyticCost` prices one component with a few physically meaningful terms::

    time(b, n)   = fixed + per_item · (b / n) · tail(b) + serial_per_item · b
                   + sync · log2(n)
    tail(b)      = 1 + tail · ln(b)          (long-tailed generation: the slowest of b
                                               sequences sets the length of the call)
    memory(b, n) = sharded / n + replicated + per_item_memory · b / n

- ``per_item`` is seconds per item on one device (compute- or bandwidth-bound work that data
  parallelism divides), ``serial_per_item`` work that more devices do not speed up (a CPU
  simulator bounded by host cores, a single-threaded verifier),
- ``sync`` is the cost of a collective per doubling of devices (gradient all-reduce),
- ``sharded`` is state split across devices (FSDP/ZeRO-3 weights + optimizer), ``replicated``
  state every device holds (rollout weights per TP group), ``per_item_memory`` activations or
  KV cache per item.

Cost files (`load_cost_model`) are JSON/YAML, either a profiler profile (``format:
rlinf-profile/1``, fitted with `rlinf.sched.profiler.fit_profile`) or::

    format: rlinf-analytic-costs/1
    components:
      rollout: {fixed: 2.0, per_item: 0.5, tail: 0.15, replicated: 30e9, per_item_memory: 2e8,
                switch: 4.0}
      actor: {trainer: {parameters: 7e9, layers: 32, hidden: 4096, heads: 32, kv_heads: 8,
                        vocab: 152064, tokens_per_item: 2048, device_memory: 80e9}}

A ``trainer`` entry (`rlinf.sched.model_parallel.TrainerCost`) prices the trainer under its
best tensor x pipeline x data parallel cut of each device count.
"""

from __future__ import annotations

import math
import os
from collections.abc import Mapping
from dataclasses import asdict, dataclass, fields
from typing import Any

from rlinf.sched._files import check_number_fields, load_mapping, read_number
from rlinf.sched.costs import CostModel
from rlinf.sched.errors import ProfileError
from rlinf.sched.model_parallel import TrainerCost

__all__ = ["ANALYTIC_FORMAT", "AnalyticCost", "AnalyticCostModel", "load_cost_model"]

ANALYTIC_FORMAT = "rlinf-analytic-costs/1"


@dataclass(frozen=True)
class AnalyticCost:
    """Closed-form cost of one component (formulas in the module docstring)."""

    fixed: float = 0.0
    """Seconds per call regardless of size (launch, weight sync, env reset)."""
    per_item: float = 0.0
    """Seconds per item per device; divided by the device count."""
    serial_per_item: float = 0.0
    """Seconds per item that more devices do not remove."""
    sync: float = 0.0
    """Seconds per doubling of devices (collectives)."""
    tail: float = 0.0
    """Long-tail factor: the call lasts ``1 + tail·ln(b)`` times the mean item."""
    sharded: float = 0.0
    """Bytes split across the devices (weights + optimizer under FSDP)."""
    replicated: float = 0.0
    """Bytes every device holds."""
    per_item_memory: float = 0.0
    """Bytes per item (activations, KV cache), split across devices."""
    switch: float = 0.0
    """Seconds to offload and onload the component."""

    def __post_init__(self) -> None:
        check_number_fields(self, "analytic cost", error=ProfileError)

    def time(self, batch_size: int, num_devices: int) -> float:
        """Seconds for one call."""
        b, n = max(batch_size, 0), max(num_devices, 1)
        tail = 1.0 + self.tail * math.log(b) if b >= 1 else 1.0
        return (self.fixed + self.per_item * (b / n) * tail + self.serial_per_item * b
                + self.sync * math.log2(n))

    def memory(self, batch_size: int, num_devices: int) -> int:
        """Peak bytes per device for one call."""
        n = max(num_devices, 1)
        return int(self.sharded / n + self.replicated + self.per_item_memory * batch_size / n)


@dataclass(frozen=True)
class AnalyticCostModel:
    """`CostModel` from one `AnalyticCost` (or, for a trainer cut by tensor and pipeline
    parallelism, a `TrainerCost`) per component."""

    costs: Mapping[str, AnalyticCost | TrainerCost]

    def _get(self, component: str) -> AnalyticCost | TrainerCost:
        try:
            return self.costs[component]
        except KeyError:
            raise ProfileError(f"no cost for component {component!r}: expected one of "
                               f"{sorted(self.costs)}") from None

    def time(self, component: str, *, batch_size: int, num_devices: int) -> float:
        """Seconds for one call of `component`."""
        return self._get(component).time(batch_size, num_devices)

    def memory(self, component: str, *, batch_size: int, num_devices: int) -> int:
        """Peak bytes per device for one call of `component`."""
        return self._get(component).memory(batch_size, num_devices)

    def switch_time(self, component: str) -> float:
        """Offload + onload seconds of `component`."""
        return self._get(component).switch

    def to_dict(self) -> dict[str, Any]:
        """The cost-file schema in the module docstring."""
        return {"format": ANALYTIC_FORMAT,
                "components": {n: c.to_dict() if isinstance(c, TrainerCost) else asdict(c)
                               for n, c in self.costs.items()}}

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> AnalyticCostModel:
        """Read the cost-file schema; ProfileError names what is wrong."""
        comps = data.get("components")
        if not isinstance(comps, Mapping) or not comps:
            raise ProfileError("analytic cost file has no 'components' mapping: expected "
                               "{name: {fixed: ..., per_item: ..., ...}}")
        known = {f.name for f in fields(AnalyticCost)}
        costs: dict[str, AnalyticCost | TrainerCost] = {}
        for name, entry in comps.items():
            if not isinstance(entry, Mapping):
                raise ProfileError(f"components.{name} is {entry!r}: expected a mapping")
            if "trainer" in entry:
                if set(entry) != {"trainer"} or not isinstance(entry["trainer"], Mapping):
                    raise ProfileError(f"components.{name}: a 'trainer' entry stands alone "
                                       "and is a mapping (parameters, layers, hidden, ...)")
                costs[str(name)] = TrainerCost.from_dict(entry["trainer"],
                                                         f"components.{name}.trainer")
                continue
            unknown = set(entry) - known
            if unknown:
                raise ProfileError(f"components.{name} has unknown key(s) {sorted(unknown)}: "
                                   f"expected {sorted(known)}")
            costs[str(name)] = AnalyticCost(**{
                k: read_number(v, f"components.{name}.{k}", error=ProfileError)
                for k, v in entry.items()})
        return cls(costs)


def load_cost_model(path: str | os.PathLike[str]) -> CostModel:
    """Read a cost file: an analytic model, or a profiler profile fitted into curves."""
    data = load_mapping(path, error=ProfileError, what="cost")
    fmt = data.get("format")
    try:
        if fmt == ANALYTIC_FORMAT:
            return AnalyticCostModel.from_dict(data)
        from rlinf.sched.profiler import PROFILE_FORMAT, Profile, fit_profile

        if fmt == PROFILE_FORMAT:
            return fit_profile(Profile.from_dict(data))
    except ProfileError as exc:
        raise ProfileError(f"in cost file {str(path)!r}: {exc}") from exc
    raise ProfileError(f"cost file {str(path)!r} has format {fmt!r}: expected "
                       f"{ANALYTIC_FORMAT!r} or a profiler profile ('rlinf-profile/1')")
