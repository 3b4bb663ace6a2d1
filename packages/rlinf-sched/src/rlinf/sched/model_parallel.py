"""How a trainer is cut over its devices: tensor (TP), pipeline (PP) and data (DP) parallel
degrees, priced with their communication and the pipeline bubble, under a memory limit.

`TrainerCost` is a component cost (beside `AnalyticCost`) for a transformer trainer such
as the Megatron actor. On ``n`` devices it considers every cut ``tp * pp * dp = n`` that
the model's shape allows (``tp`` divides the attention and key/value heads and the
vocabulary, ``pp`` the layers), keeps those whose per-device memory fits
``device_memory``, and prices each::

    m          = ceil(items per replica / micro_batch)        pipeline micro-batches
    stage(mb)  = compute(mb) / (tp * pp)                       a stage's share of the work
                 + (layers / pp) * 4 * allreduce_tp(mb)        2 forward + 2 backward per layer
                 + p2p(mb)  if pp > 1                           hidden states to the next stage
    time(b, n) = fixed + (m + pp - 1) * stage(micro_batch)     the bubble: pp - 1 extra slots
                 + allreduce_dp(gradients / (tp * pp))

    compute(mb)     = 6 * parameters * tokens(mb) / (device_flops * efficiency)
    allreduce_g(x)  = 2 (g - 1) / g * x / bandwidth + 2 (g - 1) * latency     (ring)
    memory(b, n)    = parameters * bytes_per_parameter / (tp * pp)
                      - the share of the moments the distributed optimizer moves off
                        (optimizer_bytes_per_parameter * (dp - 1) / dp, per tp * pp)
                      + min(m, pp) micro-batches' activations of layers / pp

Activations per token and layer (Korthikanti et al. 2022, 16-bit): ``34 h + 5 a s``
bytes; tensor parallelism splits ``24 h + 5 a s`` of it, and sequence parallelism the
remaining ``10 h`` (norms, residuals) too. Sequence parallelism's all-gather and
reduce-scatter move what the all-reduce they replace moves, and so do the distributed
optimizer's reduce-scatter and all-gather: both options change memory, not time.

The schedule is the one the actor runs (`rlinf.workers.actor.megatron.pipeline`, 1F1B):
the first stage holds at most ``pp`` micro-batches' activations at once.
`time` and `memory` price the fastest cut that fits; `cut` says which it is, and
`rlinf.sched.plan` records it in `ExecutionPlan.parallelism`.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping
from dataclasses import asdict, dataclass, fields
from typing import Any

from rlinf.sched._files import check_number_fields, read_number
from rlinf.sched.errors import ProfileError
from rlinf.sched.execution_plan import ExecutionPlan, PlanResult
from rlinf.sched.workflow import Workflow

__all__ = ["CutPricedCosts", "ParallelCut", "TrainerCost", "annotate_cuts", "format_cut"]


@dataclass(frozen=True, order=True)
class ParallelCut:
    """Degrees of one cut; their product is the device count."""

    tensor: int
    pipeline: int
    data: int
    sequence_parallel: bool = False
    """Activations split by sequence across the tensor-parallel ranks (TP > 1)."""
    distributed_optimizer: bool = False
    """Optimizer state split across the data-parallel ranks (DP > 1)."""

    def to_dict(self) -> dict[str, int]:
        return {"tensor": self.tensor, "pipeline": self.pipeline, "data": self.data,
                "sequence_parallel": int(self.sequence_parallel),
                "distributed_optimizer": int(self.distributed_optimizer)}


def format_cut(cut: Mapping[str, int]) -> str:
    """A cut as `ParallelCut.to_dict` (and `ExecutionPlan.parallelism`) records it, in one
    line: ``tp2 pp1 dp4 sp dopt``."""
    return (f"tp{cut['tensor']} pp{cut['pipeline']} dp{cut['data']}"
            + (" sp" if cut.get("sequence_parallel") else "")
            + (" dopt" if cut.get("distributed_optimizer") else ""))


@dataclass(frozen=True)
class TrainerCost:
    """A transformer trainer's cost under every TP x PP x DP cut (module docstring)."""

    parameters: float
    """Model parameters."""
    layers: int
    """Decoder layers (PP divides them)."""
    hidden: int
    """Hidden size."""
    heads: int
    """Attention heads (TP divides them)."""
    kv_heads: int
    """Key/value heads (TP divides them)."""
    vocab: int
    """Vocabulary size (TP divides it: the output layer is split by rows)."""
    tokens_per_item: int
    """Tokens of one item (prompt + response)."""
    micro_batch: int = 1
    """Items per pipeline micro-batch."""
    device_flops: float = 1e15
    """Peak FLOP/s of one device."""
    efficiency: float = 0.4
    """Fraction of the peak a step reaches (model FLOPs utilisation)."""
    bandwidth: float = 1e11
    """Bytes/s of the links collectives and pipeline sends use."""
    latency: float = 1e-5
    """Seconds per message of those links."""
    device_memory: float = 80e9
    """Bytes of one device; cuts that do not fit are not chosen."""
    bytes_per_parameter: float = 16.0
    """Weights, gradients and Adam moments per parameter (16: fp32 weights, fp32 grads,
    two fp32 moments)."""
    optimizer_bytes_per_parameter: float = 8.0
    """The part of `bytes_per_parameter` the distributed optimizer splits over the
    data-parallel ranks (8: two fp32 moments)."""
    sequence_parallel: float = 1.0
    """1: the trainer runs sequence parallelism wherever TP > 1; 0: it does not."""
    distributed_optimizer: float = 1.0
    """1: the trainer runs the distributed optimizer wherever DP > 1; 0: it does not."""
    activation_bytes: float = 2.0
    """Bytes per activation value (2: bf16)."""
    fixed: float = 0.0
    """Seconds per call whatever the cut (launch, optimizer step overheads)."""
    switch: float = 0.0
    """Seconds to offload and onload the trainer."""

    def __post_init__(self) -> None:
        check_number_fields(self, "trainer cost", error=ProfileError)
        for name in ("parameters", "layers", "hidden", "heads", "kv_heads", "vocab",
                     "tokens_per_item", "micro_batch", "device_flops", "efficiency",
                     "bandwidth", "device_memory", "bytes_per_parameter", "activation_bytes"):
            if not getattr(self, name) > 0:
                raise ProfileError(f"trainer cost {name}={getattr(self, name)!r}: expected > 0")
        for name in ("layers", "heads", "kv_heads", "vocab", "tokens_per_item", "micro_batch"):
            if getattr(self, name) != int(getattr(self, name)):
                raise ProfileError(f"trainer cost {name}={getattr(self, name)!r}: expected a "
                                   "whole number")
        for name in ("sequence_parallel", "distributed_optimizer"):
            if getattr(self, name) not in (0, 1):
                raise ProfileError(f"trainer cost {name}={getattr(self, name)!r}: expected 1 "
                                   "(on) or 0 (off)")
        if self.optimizer_bytes_per_parameter > self.bytes_per_parameter:
            raise ProfileError(f"trainer cost optimizer_bytes_per_parameter="
                               f"{self.optimizer_bytes_per_parameter!r} exceeds "
                               f"bytes_per_parameter={self.bytes_per_parameter!r}, of which "
                               "it is a part")

    # -- cuts --------------------------------------------------------------------------------

    def cuts(self, devices: int) -> list[ParallelCut]:
        """Every cut of `devices` the model's shape allows."""
        out = []
        for tp in _divisors(devices):
            if self.heads % tp or self.kv_heads % tp or self.vocab % tp:
                continue
            for pp in _divisors(devices // tp):
                if self.layers % pp == 0:
                    dp = devices // (tp * pp)
                    out.append(ParallelCut(
                        tp, pp, dp, sequence_parallel=bool(self.sequence_parallel) and tp > 1,
                        distributed_optimizer=bool(self.distributed_optimizer) and dp > 1))
        return out

    def seconds(self, cut: ParallelCut, batch_size: int) -> float:
        """Seconds of one step of `batch_size` items under `cut`."""
        micro = self._micro_batches(cut, batch_size)
        items = min(self.micro_batch, max(1, math.ceil(batch_size / cut.data)))
        tokens = items * self.tokens_per_item
        compute = 6 * self.parameters * tokens / (self.device_flops * self.efficiency)
        activations = tokens * self.hidden * self.activation_bytes
        stage = compute / (cut.tensor * cut.pipeline)
        stage += self.layers / cut.pipeline * 4 * self._allreduce(activations, cut.tensor)
        if cut.pipeline > 1:
            stage += 2 * (activations / self.bandwidth + self.latency)  # forward + backward
        gradients = self.parameters * 4 / (cut.tensor * cut.pipeline)
        return (self.fixed + (micro + cut.pipeline - 1) * stage
                + self._allreduce(gradients, cut.data))

    def memory_of(self, cut: ParallelCut, batch_size: int) -> int:
        """Peak bytes per device under `cut`."""
        micro = self._micro_batches(cut, batch_size)
        items = min(self.micro_batch, max(1, math.ceil(batch_size / cut.data)))
        tokens = items * self.tokens_per_item
        # Per token and layer without recomputation (module docstring); a stage holds
        # layers / pp of them.
        split = 24 * self.hidden + 5 * self.heads * self.tokens_per_item
        whole = 10 * self.hidden
        if cut.sequence_parallel:
            split, whole = split + whole, 0
        per_layer = tokens * (whole + split / cut.tensor) * self.activation_bytes / 2
        in_flight = min(micro, cut.pipeline)
        activations = in_flight * per_layer * (self.layers / cut.pipeline)
        per_parameter = self.bytes_per_parameter
        if cut.distributed_optimizer:
            per_parameter -= self.optimizer_bytes_per_parameter * (cut.data - 1) / cut.data
        state = self.parameters * per_parameter / (cut.tensor * cut.pipeline)
        return int(state + activations)

    def cut(self, batch_size: int, num_devices: int) -> ParallelCut:
        """The fastest cut of `num_devices` that fits `device_memory`, else the one needing
        the least memory (the planner then finds it too big). Data parallelism alone is
        always a cut."""
        cuts = self.cuts(max(num_devices, 1))
        fitting = [c for c in cuts if self.memory_of(c, batch_size) <= self.device_memory]
        if fitting:
            return min(fitting, key=lambda c: (self.seconds(c, batch_size), c))
        return min(cuts, key=lambda c: (self.memory_of(c, batch_size), c))

    # -- the component cost the planner asks for --------------------------------------------

    def time(self, batch_size: int, num_devices: int) -> float:
        """Seconds of one call on `num_devices`, under `cut`'s choice."""
        return self.seconds(self.cut(batch_size, num_devices), batch_size)

    def memory(self, batch_size: int, num_devices: int) -> int:
        """Peak bytes per device under `cut`'s choice."""
        return self.memory_of(self.cut(batch_size, num_devices), batch_size)

    def _micro_batches(self, cut: ParallelCut, batch_size: int) -> int:
        return max(1, math.ceil(batch_size / cut.data / self.micro_batch))

    def _allreduce(self, size: float, group: int) -> float:
        if group <= 1:
            return 0.0
        return 2 * (group - 1) / group * size / self.bandwidth + 2 * (group - 1) * self.latency

    # -- files ----------------------------------------------------------------------------

    def to_dict(self) -> dict[str, Any]:
        return {"trainer": asdict(self)}

    @classmethod
    def from_dict(cls, data: Mapping[str, Any], where: str) -> TrainerCost:
        """The ``trainer:`` mapping of a cost file's component; ProfileError names the key."""
        known = {f.name for f in fields(cls)}
        unknown = set(data) - known
        if unknown:
            raise ProfileError(f"{where} has unknown key(s) {sorted(unknown)}: expected "
                               f"{sorted(known)}")
        values: dict[str, float | int] = {}
        for key, raw in data.items():
            number = read_number(raw, f"{where}.{key}", error=ProfileError)
            values[key] = int(number) if key in _WHOLE and number == int(number) else number
        try:
            return cls(**values)  # type: ignore[arg-type]
        except TypeError as exc:
            raise ProfileError(f"{where}: {exc}") from None
        except ProfileError as exc:
            raise ProfileError(f"{where}: {exc}") from None


_WHOLE = frozenset({"layers", "hidden", "heads", "kv_heads", "vocab", "tokens_per_item",
                    "micro_batch"})


@dataclass(frozen=True)
class CutPricedCosts:
    """A cost model whose `component`, a trainer measured cut data-parallel only (tensor =
    pipeline = 1, no sequence parallelism, no distributed optimizer), is priced under
    the cut `trainer` chooses for each call: the measured time and memory times what
    `trainer` prices the chosen cut at relative to data parallelism alone on the same
    devices. The measurement carries what the model does not know (kernels, the
    runtime's overheads), the model what was not measured (tensor and pipeline
    communication, the bubble, the memory a cut saves). `trainer.device_memory` decides
    which cuts fit, as in `TrainerCost.cut`; on devices where none fits the component's
    memory is the modelled need, which the planner refuses; elsewhere, where `base`
    measured no memory (CPU slots), it stays 0 as `base` prices it. Every other
    component is `base`'s. `annotate_cuts` records the cut in each plan (`costs`)."""

    base: Any
    """The measured cost model (`rlinf.sched.CostModel`)."""
    trainer: TrainerCost
    component: str = "actor"

    @property
    def costs(self) -> dict[str, TrainerCost]:
        return {self.component: self.trainer}

    def _cuts(self, batch_size: int, num_devices: int) -> tuple[ParallelCut, ParallelCut]:
        """The cut chosen, and the one measured: data parallel, every replica with all of
        its optimizer state (the profile's trainer runs neither option)."""
        return self.trainer.cut(batch_size, num_devices), ParallelCut(1, 1, num_devices)

    def time(self, component: str, *, batch_size: int, num_devices: int) -> float:
        measured = float(self.base.time(component, batch_size=batch_size,
                                        num_devices=num_devices))
        if component != self.component:
            return measured
        chosen, data_only = self._cuts(batch_size, num_devices)
        return measured * (self.trainer.seconds(chosen, batch_size)
                           / self.trainer.seconds(data_only, batch_size))

    def memory(self, component: str, *, batch_size: int, num_devices: int) -> int:
        measured = int(self.base.memory(component, batch_size=batch_size,
                                        num_devices=num_devices))
        if component != self.component:
            return measured
        chosen, data_only = self._cuts(batch_size, num_devices)
        modelled = self.trainer.memory_of(chosen, batch_size)
        if modelled > self.trainer.device_memory:
            return modelled  # no cut of these devices fits: the planner must not use them
        if measured == 0:
            return 0
        return int(measured * modelled / self.trainer.memory_of(data_only, batch_size))

    def switch_time(self, component: str) -> float:
        return float(self.base.switch_time(component))


def annotate_cuts(result: PlanResult, workflow: Workflow, cost: Any) -> PlanResult:
    """`result` with each plan's `ExecutionPlan.parallelism` filled in for the components
    `cost` prices with a `TrainerCost` (the cut `TrainerCost.cut` chose at the plan's
    micro-batch and device count)."""
    trainers = {name: entry for name, entry in getattr(cost, "costs", {}).items()
                if isinstance(entry, TrainerCost)}
    if not trainers:
        return result

    def annotated(found: ExecutionPlan) -> ExecutionPlan:
        cuts = {}
        for name, trainer in trainers.items():
            if name not in found.placement.components:
                continue
            devices = len(found.placement.components[name].devices)
            batch = found.micro_batch.get(name, workflow.batch_of(name))
            cuts[name] = trainer.cut(batch, devices).to_dict()
        return dataclasses.replace(found, parallelism=cuts)

    return dataclasses.replace(
        result, ranked=tuple(annotated(p) for p in result.ranked),
        baselines={k: annotated(p) for k, p in result.baselines.items()})


def _divisors(n: int) -> list[int]:
    return [d for d in range(1, n + 1) if n % d == 0]
