"""Padding-free forwards: a micro-batch's sequences packed end to end, no padding computed.

A rollout batch is padded twice: prompts on the left to the longest prompt, responses on
the right to the longest response. Every padded position costs a transformer as much as a
real token, and RL responses vary in length (some stop at EOS after a few tokens, others
run to the limit), so a padded forward/backward computes many positions nobody reads.
`pack_rows` lays each row's real tokens (prompt then response) out end to end, first-fit
by decreasing length into packed rows as wide as the longest sequence, with position ids
that restart at 0 at each sequence. transformers' decoders read that as packed sequences
(attention mask None and position ids that restart: `masking_utils`), so each sequence
attends only to itself: on CPU and with ``sdpa``/``eager`` through a block-diagonal causal
mask, with ``flash_attention_2`` through its variable-length kernel. veRL calls this
``use_remove_padding``.

The numbers are those of the padded forward up to float noise (~1e-6 in fp32). Whether a
model honours packed position ids is not visible from its class (a wrapper may drop them;
an older transformers ignores them), so `packing_works` checks it once per model: a short
sequence packed behind a longer one must score as it does alone. A model that fails keeps
the padded forward, with a warning.

Backward through the bench's 2-layer, 512-wide Qwen2-style model over 64 rows (prompts of
4-6 tokens, responses of at most 32, 28% stopped early: 86% of the padded positions real),
fp32, one AVX2 core, was quicker packed than padded.
"""

from __future__ import annotations

import weakref
from dataclasses import dataclass

import structlog
import torch
from torch import nn

__all__ = ["PackedRows", "pack_rows", "packed_response_logits", "packing_works"]

_log = structlog.get_logger(__name__)

_MIN_SAVING = 0.05
"""Smallest share of the padded positions packing must save to be used (below it the
padded forward costs the same and keeps the batch's layout)."""


@dataclass(frozen=True)
class PackedRows:
    """Rows of a padded batch packed end to end (`pack_rows`)."""

    input_ids: torch.Tensor
    """``[N, W]`` token ids: sequences end to end, 0 after the last one of a packed row."""
    position_ids: torch.Tensor
    """``[N, W]`` positions restarting at 0 at each sequence (0 on the tail)."""
    logit_rows: torch.Tensor
    """``[T]`` packed row of the position predicting each response token."""
    logit_columns: torch.Tensor
    """``[T]`` packed column of the position predicting each response token."""
    response_rows: torch.Tensor
    """``[T]`` row of each response token in the padded ``[B, R]`` layout."""
    response_columns: torch.Tensor
    """``[T]`` column of each response token in the padded ``[B, R]`` layout."""

    @property
    def cells(self) -> int:
        """Positions a forward over the packed rows computes."""
        return self.input_ids.numel()


def pack_rows(prompt_ids: torch.Tensor, prompt_mask: torch.Tensor, response_ids: torch.Tensor,
              response_mask: torch.Tensor) -> PackedRows | None:
    """The rows packed (see the module docstring), or None where packing does not apply:
    a response that is not left-aligned in its columns, a response without a prompt token
    before it (nothing predicts its first token), or a saving under `_MIN_SAVING`."""
    prompt_valid, response_valid = prompt_mask.bool(), response_mask.bool()
    prompt_lengths = prompt_valid.sum(dim=1)
    response_lengths = response_valid.sum(dim=1)
    aligned = bool((response_valid[:, 1:] <= response_valid[:, :-1]).all()) \
        if response_valid.shape[1] > 1 else True
    if not aligned or bool(((prompt_lengths == 0) & (response_lengths > 0)).any()):
        return None
    lengths = (prompt_lengths + response_lengths).tolist()
    width = max(lengths, default=0)
    if width == 0:
        return None
    rows_of, offsets = _first_fit_decreasing(lengths, width)
    packed_rows = max(rows_of) + 1
    padded_cells = prompt_ids.shape[0] * (prompt_ids.shape[1] + response_ids.shape[1])
    if packed_rows * width > (1 - _MIN_SAVING) * padded_cells:
        return None
    device = prompt_ids.device
    row_of = torch.tensor(rows_of, device=device)
    offset = torch.tensor(offsets, device=device)
    ids = torch.cat([prompt_ids, response_ids], dim=1)
    valid = torch.cat([prompt_valid, response_valid], dim=1)
    rows, columns = valid.nonzero(as_tuple=True)  # row-major: each row's tokens in order
    position = (valid.long().cumsum(dim=1) - 1)[rows, columns]
    input_ids = torch.zeros((packed_rows, width), dtype=ids.dtype, device=device)
    position_ids = torch.zeros((packed_rows, width), dtype=torch.long, device=device)
    input_ids[row_of[rows], offset[rows] + position] = ids[rows, columns]
    position_ids[row_of[rows], offset[rows] + position] = position
    # Response token j of row i is predicted at its sequence's position p_i - 1 + j.
    response_rows, response_columns = response_valid.nonzero(as_tuple=True)
    return PackedRows(
        input_ids=input_ids, position_ids=position_ids, logit_rows=row_of[response_rows],
        logit_columns=offset[response_rows] + prompt_lengths[response_rows] - 1
        + response_columns,
        response_rows=response_rows, response_columns=response_columns)


def _first_fit_decreasing(lengths: list[int], capacity: int) -> tuple[list[int], list[int]]:
    """Per sequence, the packed row it goes to and its offset there: longest first, each
    into the first row with room (rows hold `capacity` positions)."""
    rows_of = [0] * len(lengths)
    offsets = [0] * len(lengths)
    room: list[int] = []
    for index in sorted(range(len(lengths)), key=lambda i: -lengths[i]):
        length = lengths[index]
        row = next((r for r, free in enumerate(room) if free >= length), len(room))
        if row == len(room):
            room.append(capacity)
        rows_of[index], offsets[index] = row, capacity - room[row]
        room[row] -= length
    return rows_of, offsets


def packed_response_logits(model: nn.Module, packed: PackedRows, *,
                           response_shape: tuple[int, int]) -> torch.Tensor:
    """Logits predicting each response token, ``[B, R, V]`` in the padded layout
    (`response_shape` is ``(B, R)``; 0 at padding), from one forward over `packed`."""
    out = model(input_ids=packed.input_ids, position_ids=packed.position_ids,
                attention_mask=None, use_cache=False)
    picked = out.logits[packed.logit_rows, packed.logit_columns]
    logits = picked.new_zeros((*response_shape, picked.shape[-1]))
    return logits.index_put((packed.response_rows, packed.response_columns), picked)


_CHECKED: weakref.WeakKeyDictionary[nn.Module, bool] = weakref.WeakKeyDictionary()
"""Per model: whether `packing_works` found it honours packed position ids."""

_CHECK_TOLERANCE = {torch.float32: 1e-3, torch.float64: 1e-6}
"""Largest log-prob difference the check accepts per parameter dtype (others: 5e-2)."""


def packing_works(model: nn.Module) -> bool:
    """Whether `model` scores a sequence packed behind another as it scores it alone (a
    forward of 17 tokens, once per model; see the module docstring)."""
    known = _CHECKED.get(model)
    if known is not None:
        return known
    works = _check_packing(model)
    _CHECKED[model] = works
    if not works:
        _log.warning("padding_free_unsupported", model=type(model).__name__,
                     reason="a sequence packed behind another scored differently from "
                            "the same sequence alone; this model trains on padded rows")
    return works


def _check_packing(model: nn.Module) -> bool:
    embeddings = getattr(model, "get_input_embeddings", lambda: None)()
    vocab = getattr(embeddings, "num_embeddings", 0)
    parameter = next(model.parameters(), None)
    if vocab < 2 or parameter is None:
        return False
    device = parameter.device
    first = torch.arange(12, device=device) % (vocab - 1) + 1
    second = torch.tensor([3, 1, 4, 1, 5], device=device) % (vocab - 1) + 1
    was_training = model.training
    model.eval()  # no dropout: the two forwards must see the same function
    try:
        with torch.no_grad(), torch.autocast(device.type, enabled=False):
            alone = model(input_ids=second[None], use_cache=False).logits[0]
            packed = model(input_ids=torch.cat([first, second])[None],
                           position_ids=torch.cat([torch.arange(12, device=device),
                                                   torch.arange(5, device=device)])[None],
                           attention_mask=None, use_cache=False).logits[0, 12:]
    except (TypeError, ValueError, RuntimeError) as exc:
        _log.warning("padding_free_check_failed", model=type(model).__name__, error=str(exc))
        return False
    finally:
        model.train(was_training)
    difference = (torch.log_softmax(alone.float(), -1)
                  - torch.log_softmax(packed.float(), -1)).abs().max()
    return bool(difference <= _CHECK_TOLERANCE.get(parameter.dtype, 5e-2))
