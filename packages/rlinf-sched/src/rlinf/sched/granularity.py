"""Micro-batch sizes the runtime executes exactly, and the planner's candidate sizes.

A component processes its batch (per step) in calls of `micro_batch` items; the last call
holds the remainder when the size does not divide the batch. A size is *runnable* on ``n``
devices when it meets the component's declarations (`rlinf.sched.Component`):

- a whole number of units of `micro_batch_multiple` items (e.g. GRPO groups);
- a divisor of the batch with `micro_batch_divides` (e.g. equal env stage groups);
- the whole batch with `whole_batch`, and always for a streaming component (one call);
- the micro-batch of its leader with `same_micro_batch_as` (e.g. the policy serving an
  env's stage groups);

and, whatever the declarations, when every call gives each device at least one unit: the
smallest call (the remainder, if any) holds at least ``n × micro_batch_multiple`` items —
and, with `split_evenly`, an equal share: ``n`` divides every call.
More devices than that would sit idle while their time is still counted as useful.

`check_micro_batches` validates a plan's sizes (what the simulator and the apps call);
`micro_batch_choices` gives the planner's candidates, and `runnable_sizes` narrows them to a
device count.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from rlinf.sched.errors import PlanningError
from rlinf.sched.workflow import Workflow

__all__ = [
    "SizeRule",
    "check_micro_batches",
    "micro_batch_choices",
    "runnable_sizes",
    "size_problem",
    "size_rule",
    "smallest_call",
]


@dataclass(frozen=True)
class SizeRule:
    """The declarations of a micro-batch group (a component and those that follow it),
    merged: a size must meet every member's."""

    batch: int
    """Items per step of every member."""
    multiple: int
    """Sizes are multiples of this (least common multiple of the members' units)."""
    divides: bool
    """Sizes divide the batch."""
    whole: bool
    """Only the whole batch (a streaming or `whole_batch` member)."""

    def allows(self, size: int) -> bool:
        """Whether `size` meets the declarations (devices aside)."""
        if self.whole:
            return size == self.batch
        return (1 <= size <= self.batch and size % self.multiple == 0
                and (not self.divides or self.batch % size == 0))


def size_rule(workflow: Workflow, name: str) -> SizeRule:
    """The merged declarations of `name`'s micro-batch group (`Workflow.micro_batch_group`)."""
    members = [workflow.component(n) for n in workflow.micro_batch_group(name)]
    return SizeRule(
        batch=workflow.batch_of(name),
        multiple=math.lcm(*(c.micro_batch_multiple for c in members)),
        divides=any(c.micro_batch_divides for c in members),
        whole=any(c.whole_batch or c.streaming for c in members),
    )


def smallest_call(batch: int, size: int) -> int:
    """Items of the smallest call when `batch` items go in calls of `size`."""
    return batch % size or size


def micro_batch_choices(workflow: Workflow, name: str, *, max_chunks: int) -> tuple[int, ...]:
    """Candidate sizes for `name`'s group, coarse to fine: for k = 1, 2, 4, … up to
    `max_chunks` (and the batch), the allowed size nearest ``ceil(batch / k)`` (ties: the
    larger), without repeats. Unconstrained components get exactly ``ceil(batch / k)``."""
    rule = size_rule(workflow, name)
    if rule.whole:
        return (rule.batch,)
    divisors = [d for d in _divisors(rule.batch) if d % rule.multiple == 0]
    sizes: list[int] = []
    k = 1
    while k <= max_chunks and k <= rule.batch:
        target = math.ceil(rule.batch / k)
        if rule.divides:
            size = min(divisors, key=lambda s: (abs(s - target), -s))
        else:
            m = rule.multiple
            low = max(m, target // m * m)
            high = min(rule.batch, -(-target // m) * m)
            size = high if abs(high - target) <= abs(target - low) else low
        if size not in sizes:
            sizes.append(size)
        k *= 2
    return tuple(sizes)


def runnable_sizes(choices: Sequence[int], batch: int, *, items_per_call: int) -> tuple[int, ...]:
    """The `choices` whose every call holds at least `items_per_call` items (devices × unit);
    the whole batch is always kept when it does (callers place no more devices than that)."""
    return tuple(s for s in choices if smallest_call(batch, s) >= items_per_call)


def size_problem(workflow: Workflow, name: str, size: int, *, devices: int = 1) -> str | None:
    """Why component `name` cannot run micro-batches of `size` on `devices` devices, or None
    when it can (the module docstring's rules, its own and its group's)."""
    comp = workflow.component(name)
    rule = size_rule(workflow, name)
    if comp.streaming:
        size = rule.batch
    if not rule.allows(size):
        if rule.whole:
            what = f"the whole batch {rule.batch} (streaming or whole_batch)"
        else:
            what = f"a multiple of {rule.multiple} in 1..{rule.batch}"
            if rule.divides:
                what += f" that divides {rule.batch}"
        return f"component {name!r} has micro-batch {size}: expected {what}"
    need = devices * comp.micro_batch_multiple
    smallest = smallest_call(rule.batch, size)
    if comp.split_evenly and (size % devices or smallest % devices):
        return (f"component {name!r} on {devices} device(s) has calls of {size} item(s) "
                f"(micro-batch {size} of {rule.batch}): expected calls that split evenly over "
                "its devices (split_evenly); give it a device count that divides the "
                "micro-batch")
    if smallest < need:
        return (f"component {name!r} on {devices} device(s) has a call of {smallest} item(s) "
                f"(micro-batch {size} of {rule.batch}): expected at least "
                f"{comp.micro_batch_multiple} per device ({need}); give it fewer devices or a "
                "larger micro-batch")
    return None


def check_micro_batches(workflow: Workflow, micro_batch: Mapping[str, int], *,
                        devices: Mapping[str, int] | None = None) -> dict[str, int]:
    """Validate a plan's micro-batch sizes: every component's (missing: its whole batch)
    meets its declarations and, with `devices` (component → device count), gives each of
    its devices at least one unit per call; components sharing a micro-batch have equal
    ones. Returns the size of every component (streaming ones: their batch).

    Raises:
        PlanningError: naming the first component that breaks a rule, and what was expected.
    """
    sizes = {c.name: workflow.batch_of(c.name) if c.streaming
             else int(micro_batch.get(c.name, workflow.batch_of(c.name)))
             for c in workflow.components}
    for c in workflow.components:
        other = c.devices_divide
        if devices is not None and other is not None:
            mine, theirs = int(devices.get(c.name, 1)), int(devices.get(other, 1))
            if theirs % mine:
                raise PlanningError(f"component {c.name!r} runs on {mine} device(s), which "
                                    f"must divide {other!r}'s {theirs} (devices_divide)")
        leader = c.same_micro_batch_as
        if leader is not None and sizes[c.name] != sizes[leader]:
            raise PlanningError(f"component {c.name!r} has micro-batch {sizes[c.name]} but "
                                f"runs with the micro-batch of {leader!r} ({sizes[leader]}): "
                                "expected them equal")
        problem = size_problem(workflow, c.name, sizes[c.name],
                               devices=1 if devices is None else int(devices.get(c.name, 1)))
        if problem is not None:
            raise PlanningError(problem)
    return sizes


def _divisors(n: int) -> list[int]:
    small = [d for d in range(1, math.isqrt(n) + 1) if n % d == 0]
    return sorted({*small, *(n // d for d in small)})
