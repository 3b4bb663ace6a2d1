"""`RolloutBatch`: the padded tensors that flow rollout → reward → inference → actor.

Layout is the one `rlinf.workers.models.response_log_probs` takes: prompts left-padded
``[B, P]``, responses right-padded ``[B, R]``, each with a 0/1 mask. Rows are grouped:
``group_size`` consecutive rows answer the same prompt (GRPO's groups). Stages add fields
(`rewards`, `old_log_probs`, `ref_log_probs`) with `dataclasses.replace`, never mutate.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import torch

from rlinf.comm import Batch
from rlinf.workers.errors import ConfigError, ShapeError
from rlinf.workers.rollout.types import RolloutSample

__all__ = ["RolloutBatch", "left_pad", "right_pad"]

_OPTIONAL = ("rewards", "old_log_probs", "ref_log_probs")
_TOOL_ROWS = ("turns", "tool_calls", "tool_errors", "tool_seconds")
"""``[B]`` statistics of multi-turn responses, present together with `tool_mask`."""
_TOOL = ("tool_mask", *_TOOL_ROWS)


def left_pad(rows: Sequence[Sequence[int]], *, pad_id: int) -> tuple[torch.Tensor, torch.Tensor]:
    """``[B, max_len]`` ids with padding on the left, and the matching 0/1 mask."""
    width = max((len(r) for r in rows), default=0)
    ids = torch.full((len(rows), width), pad_id, dtype=torch.long)
    mask = torch.zeros((len(rows), width), dtype=torch.long)
    for i, row in enumerate(rows):
        if row:
            ids[i, width - len(row):] = torch.tensor(list(row), dtype=torch.long)
            mask[i, width - len(row):] = 1
    return ids, mask


def right_pad(
    rows: Sequence[Sequence[float]] | Sequence[Sequence[int]], *, pad: float, dtype: torch.dtype
) -> tuple[torch.Tensor, torch.Tensor]:
    """``[B, max_len]`` values with padding on the right, and the matching 0/1 mask."""
    width = max((len(r) for r in rows), default=0)
    values = torch.full((len(rows), width), pad, dtype=dtype)
    mask = torch.zeros((len(rows), width), dtype=torch.long)
    for i, row in enumerate(rows):
        if len(row):
            values[i, : len(row)] = torch.tensor(list(row), dtype=dtype)
            mask[i, : len(row)] = 1
    return values, mask


@dataclass(frozen=True)
class RolloutBatch:
    """Responses to ``B / group_size`` prompts, ``group_size`` rows each (see module doc)."""

    prompt_ids: torch.Tensor
    """``[B, P]`` int64 prompt tokens, left-padded."""
    prompt_mask: torch.Tensor
    """``[B, P]`` 1 on prompt tokens."""
    response_ids: torch.Tensor
    """``[B, R]`` int64 response tokens, right-padded."""
    response_mask: torch.Tensor
    """``[B, R]`` 1 on response tokens (EOS included)."""
    rollout_log_probs: torch.Tensor
    """``[B, R]`` float32 log-probs the rollout engine reported (0 on padding)."""
    stopped: torch.Tensor
    """``[B]`` bool: the response ended with EOS (False: cut at the length limit)."""
    answers: tuple[str, ...]
    """Reference answer of each row's problem (repeated across a group)."""
    group_size: int
    """Consecutive rows that answer the same prompt."""
    rewards: torch.Tensor | None = None
    """``[B]`` float32 sequence rewards, set by the reward worker."""
    old_log_probs: torch.Tensor | None = None
    """``[B, R]`` log-probs under the policy that generated the batch (inference worker)."""
    ref_log_probs: torch.Tensor | None = None
    """``[B, R]`` log-probs under the reference model, for the KL term (inference worker)."""
    prompts: tuple[Any, ...] = ()
    """Each group's prompt as its dataset has it (text, or chat messages), when the rollout
    carries problems to the reward (`RolloutGeneratorConfig.problem_columns`); else empty."""
    columns: tuple[Mapping[str, Any], ...] = ()
    """Each group's dataset columns (`rlinf.envs.math.MathProblem.dataset_columns`), beside
    `prompts`."""
    tool_mask: torch.Tensor | None = None
    """``[B, R]`` bool, multi-turn responses only: True on the tokens tools wrote (their
    observations); `loss_mask` leaves them out of the loss and the KL."""
    turns: torch.Tensor | None = None
    """``[B]`` int64 turns each response took (with `tool_mask`)."""
    tool_calls: torch.Tensor | None = None
    """``[B]`` int64 tool calls each response made."""
    tool_errors: torch.Tensor | None = None
    """``[B]`` int64 calls that returned an error observation."""
    tool_seconds: torch.Tensor | None = None
    """``[B]`` float64 wall time of each response's tool calls."""

    def __post_init__(self) -> None:
        rows = self.prompt_ids.shape[0]
        if self.group_size < 1 or rows % self.group_size:
            raise ConfigError(f"group_size must be >= 1 and divide the {rows} rows, "
                              f"got {self.group_size}")
        if len(self.answers) != rows or self.stopped.shape != (rows,):
            raise ShapeError(f"expected {rows} answers and stopped flags, got "
                             f"{len(self.answers)} and {tuple(self.stopped.shape)}")
        groups = rows // self.group_size
        if len(self.prompts) != len(self.columns) or len(self.prompts) not in (0, groups):
            raise ShapeError(f"expected {groups} prompts and columns (one per group) or none, "
                             f"got {len(self.prompts)} and {len(self.columns)}")
        present = [name for name in _TOOL if getattr(self, name) is not None]
        if present and len(present) != len(_TOOL):
            raise ShapeError(f"the multi-turn fields {list(_TOOL)} come together, got only "
                             f"{present}")
        for name in _TOOL_ROWS:
            value = getattr(self, name)
            if value is not None and tuple(value.shape) != (rows,):
                raise ShapeError(f"{name} must be ({rows},), got {tuple(value.shape)}")
        shape = tuple(self.response_ids.shape)
        for name in ("response_mask", "rollout_log_probs", "old_log_probs", "ref_log_probs",
                     "tool_mask"):
            value = getattr(self, name)
            if value is not None and tuple(value.shape) != shape:
                raise ShapeError(f"{name} must be {shape} like response_ids, got "
                                 f"{tuple(value.shape)}")

    @property
    def num_rows(self) -> int:
        """Number of responses ``B``."""
        return int(self.prompt_ids.shape[0])

    @property
    def loss_mask(self) -> torch.Tensor:
        """``[B, R]`` 1 on the tokens the model wrote: `response_mask` without the tools'
        observations (what the loss, the advantages and the KL count)."""
        if self.tool_mask is None:
            return self.response_mask
        return self.response_mask * (~self.tool_mask.bool()).to(self.response_mask.dtype)

    @property
    def multi_turn(self) -> bool:
        """Whether the responses came from a multi-turn (tool) rollout."""
        return self.tool_mask is not None

    @classmethod
    def from_samples(
        cls, samples: Sequence[RolloutSample], *, answers: Sequence[str], group_size: int,
        pad_token_id: int, prompts: Sequence[Any] = (),
        columns: Sequence[Mapping[str, Any]] = (),
    ) -> RolloutBatch:
        """Pad engine samples (grouped, in order) into a batch; `prompts` and `columns`, one
        per group, travel with it when given."""
        prompt_ids, prompt_mask = left_pad([s.prompt_token_ids for s in samples],
                                           pad_id=pad_token_id)
        response_ids, response_mask = right_pad(
            [s.response_token_ids for s in samples], pad=pad_token_id, dtype=torch.long)
        log_probs, _ = right_pad([s.log_probs for s in samples], pad=0.0, dtype=torch.float32)
        tools: dict[str, torch.Tensor] = {}
        if any(s.tool_mask for s in samples):
            tools["tool_mask"] = right_pad(
                [s.tool_mask or (False,) * len(s.response_token_ids) for s in samples],
                pad=False, dtype=torch.bool)[0]
            for name, dtype in (("turns", torch.long), ("tool_calls", torch.long),
                                ("tool_errors", torch.long), ("tool_seconds", torch.float64)):
                tools[name] = torch.tensor([getattr(s, name) for s in samples], dtype=dtype)
        return cls(
            prompt_ids=prompt_ids, prompt_mask=prompt_mask, response_ids=response_ids,
            response_mask=response_mask, rollout_log_probs=log_probs,
            stopped=torch.tensor([s.finish_reason == "stop" for s in samples], dtype=torch.bool),
            answers=tuple(answers), group_size=group_size, prompts=tuple(prompts),
            columns=tuple(columns), **tools,
        )

    def without_problems(self) -> RolloutBatch:
        """This batch without `prompts` and `columns` (once scored, nothing reads them)."""
        if not self.prompts:
            return self
        return dataclasses.replace(self, prompts=(), columns=())

    def replace(self, **fields: torch.Tensor | None) -> RolloutBatch:
        """A copy with some fields changed (e.g. ``rewards=...``)."""
        return dataclasses.replace(self, **fields)  # type: ignore[arg-type]

    def select(self, rows: slice) -> RolloutBatch:
        """The rows in `rows`, a contiguous slice of whole groups (GRPO needs them whole)."""
        start, stop, step = rows.indices(self.num_rows)
        if step != 1 or start % self.group_size or max(stop - start, 0) % self.group_size:
            raise ConfigError(f"select needs a contiguous slice of whole groups of "
                              f"{self.group_size} rows, got rows {start}:{stop}:{step}")
        picked: dict[str, Any] = {
            f.name: (value[rows] if isinstance(value, torch.Tensor) else value)
            for f in dataclasses.fields(self)
            for value in [getattr(self, f.name)]
        }
        picked["answers"] = self.answers[rows]
        groups = slice(start // self.group_size, max(stop, start) // self.group_size)
        picked["prompts"], picked["columns"] = self.prompts[groups], self.columns[groups]
        return RolloutBatch(**picked)

    def to_batch(self) -> Batch:
        """A `rlinf.comm.Batch` (tensors + JSON meta) that a Channel can carry."""
        tensors = {name: getattr(self, name) for name in (
            "prompt_ids", "prompt_mask", "response_ids", "response_mask", "rollout_log_probs",
            "stopped", *_OPTIONAL, *_TOOL) if getattr(self, name) is not None}
        meta: dict[str, Any] = {"answers": list(self.answers), "group_size": self.group_size}
        if self.prompts:
            meta["prompts"], meta["columns"] = list(self.prompts), list(self.columns)
        return Batch(tensors, meta=meta)

    @classmethod
    def from_batch(cls, batch: Batch) -> RolloutBatch:
        """Inverse of `to_batch` (tensors may arrive as numpy arrays; they become torch)."""
        def tensor(name: str) -> torch.Tensor:
            return torch.as_tensor(batch[name])

        return cls(
            prompt_ids=tensor("prompt_ids"), prompt_mask=tensor("prompt_mask"),
            response_ids=tensor("response_ids"), response_mask=tensor("response_mask"),
            rollout_log_probs=tensor("rollout_log_probs"), stopped=tensor("stopped"),
            answers=tuple(batch.meta["answers"]), group_size=int(batch.meta["group_size"]),
            prompts=tuple(batch.meta.get("prompts", ())),
            columns=tuple(batch.meta.get("columns", ())),
            **{name: tensor(name) for name in (*_OPTIONAL, *_TOOL) if name in batch},
        )

    @classmethod
    def concat(cls, batches: Sequence[RolloutBatch], *, pad_token_id: int) -> RolloutBatch:
        """Stack batches of one group size, re-padding prompts (left) and responses (right)."""
        if not batches:
            raise ConfigError("concat needs at least one batch")
        sizes = {b.group_size for b in batches}
        if len(sizes) != 1:
            raise ConfigError(f"batches must share one group_size, got {sorted(sizes)}")
        width_p = max(b.prompt_ids.shape[1] for b in batches)
        width_r = max(b.response_ids.shape[1] for b in batches)

        def cat(name: str, width: int, *, left: bool, pad: float) -> torch.Tensor:
            parts = []
            for b in batches:
                value = getattr(b, name)
                extra = width - value.shape[1]
                spec = (extra, 0) if left else (0, extra)
                parts.append(torch.nn.functional.pad(value, spec, value=pad))
            return torch.cat(parts)

        optional = {
            name: cat(name, width_r, left=False, pad=0.0)
            for name in _OPTIONAL[1:] if all(getattr(b, name) is not None for b in batches)
        }
        if all(b.tool_mask is not None for b in batches):
            optional["tool_mask"] = cat("tool_mask", width_r, left=False, pad=False)
            for name in _TOOL_ROWS:
                optional[name] = torch.cat([getattr(b, name) for b in batches])
        elif any(b.tool_mask is not None for b in batches):
            raise ConfigError("concat got multi-turn batches beside single-turn ones")
        carried = all(b.prompts for b in batches)
        if all(b.rewards is not None for b in batches):
            optional["rewards"] = torch.cat([b.rewards for b in batches  # type: ignore[misc]
                                             ])
        return cls(
            prompt_ids=cat("prompt_ids", width_p, left=True, pad=pad_token_id),
            prompt_mask=cat("prompt_mask", width_p, left=True, pad=0),
            response_ids=cat("response_ids", width_r, left=False, pad=pad_token_id),
            response_mask=cat("response_mask", width_r, left=False, pad=0),
            rollout_log_probs=cat("rollout_log_probs", width_r, left=False, pad=0.0),
            stopped=torch.cat([b.stopped for b in batches]),
            answers=tuple(a for b in batches for a in b.answers),
            group_size=batches[0].group_size,
            prompts=tuple(p for b in batches for p in b.prompts) if carried else (),
            columns=tuple(c for b in batches for c in b.columns) if carried else (),
            **optional,
        )
