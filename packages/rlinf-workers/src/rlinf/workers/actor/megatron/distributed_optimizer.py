"""`DistributedAdamW`: Megatron's distributed optimizer (ZeRO stage 1) for the Megatron actor.

The model-parallel rank's parameters, laid end to end, are cut into one contiguous range
per data-parallel rank. Each rank keeps AdamW's moments for its range only (1/dp of them),
and an optimizer step is:

1. gradients reduce-scattered over the data-parallel group: each rank receives the summed
   gradient of its range (the same volume as the all-reduce it replaces, half of it);
2. the gradient norm from the ranges (`local_square_norm`, summed by the caller);
3. AdamW on the range, in place in the parameters (the range's pieces are views of them);
4. the updated ranges all-gathered, so every replica holds the whole model again.

AdamW is elementwise, so the update equals the unsharded one. megatron-core's own
``DistributedOptimizer`` is not used: it accepts only ``torch.cuda.*Tensor`` parameters
(``distrib_optimizer.py``, ``_build_model_and_main_param_groups``) and needs its DDP grad
buffers, so it cannot run, or be tested, on a CPU. The algorithm and the communication are
the same; the moments are saved in the same per-parameter form as the unsharded
optimizer's, so either optimizer and any data-parallel degree resume from either's
checkpoint. Parameter groups (PPO's critic at its own learning rate) are given as torch's
optimizers take them; each group steps its pieces with its own settings.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed as dist
from torch import nn

__all__ = ["DistributedAdamW"]

_MOMENTS = ("exp_avg", "exp_avg_sq")


@dataclass(frozen=True)
class _Piece:
    """The part of one parameter inside this rank's range."""

    index: int
    """Position of the parameter in the model's parameter list."""
    start: int
    """First element of the parameter (flattened) in the range."""
    stop: int
    """One past the last."""
    offset: int
    """Where the piece starts inside the range."""


class DistributedAdamW(torch.optim.AdamW):
    """AdamW whose parameters are this data-parallel rank's pieces of the model's parameters
    (module docstring). The model's own parameters stay whole; call `reduce_scatter_gradients`
    before `step` and `gather_parameters` after it.

    Its ``state_dict`` is this rank's range (resume on the same cut); `full_state_dict` and
    `load_full_state_dict` are the per-parameter form for a resharding checkpoint."""

    state_by_position = True
    """Its state is keyed by the positions of its own pieces, not by the module's parameter
    names: checkpoint code saves ``state_dict()`` as it is (`checkpoint.save`)."""

    def __init__(self, params: Sequence[nn.Parameter] | Sequence[Mapping[str, Any]], *,
                 group: Any, lr: float, betas: tuple[float, float],
                 weight_decay: float) -> None:
        """`params`: the model's parameters, or parameter groups as torch's optimizers take
        them (``{"params": [...], "lr": ...}``; unset settings from the keywords)."""
        groups = [dict(g) for g in params if isinstance(g, Mapping)]
        if len(groups) != len(params):
            groups = [{"params": list(params)}]
        self.model_params = [p for g in groups for p in g["params"]]
        if not self.model_params:
            raise ValueError("DistributedAdamW needs at least one parameter")
        self.group_of = [index for index, g in enumerate(groups) for _ in g["params"]]
        """The parameter group of each model parameter."""
        self.group = group
        self.world = dist.get_world_size(group)
        self.rank = dist.get_rank(group)
        self.sizes = [p.numel() for p in self.model_params]
        self.total = sum(self.sizes)
        self.range_size = -(-self.total // self.world)
        first = min(self.rank * self.range_size, self.total)
        self.range = (first, min(first + self.range_size, self.total))
        self.pieces = _pieces(self.sizes, *self.range)
        self.views = [nn.Parameter(self._view(piece)) for piece in self.pieces]
        # Every rank keeps every group (equal settings and state layout); one with no piece
        # in this rank's range (more ranks than elements) steps a zero-length placeholder.
        to_step = []
        for index, settings in enumerate(groups):
            mine = [view for view, piece in zip(self.views, self.pieces, strict=True)
                    if self.group_of[piece.index] == index]
            to_step.append(settings | {"params": mine or [
                nn.Parameter(torch.zeros(0, device=self.device))]})
        super().__init__(to_step, lr=lr, betas=betas, weight_decay=weight_decay)

    @property
    def device(self) -> torch.device:
        return self.model_params[0].device

    def _view(self, piece: _Piece) -> torch.Tensor:
        return self.model_params[piece.index].detach().view(-1)[piece.start: piece.stop]

    def rebind(self) -> None:
        """Point the pieces at the parameters' current storage (after they moved device:
        `move_module` swaps ``param.data``)."""
        for view, piece in zip(self.views, self.pieces, strict=True):
            view.data = self._view(piece)

    # -- one step ----------------------------------------------------------------------------

    def reduce_scatter_gradients(self) -> None:
        """Sum the model parameters' gradients over the data-parallel group into this rank's
        pieces (a parameter without a gradient contributes zeros), and drop the model's
        full gradients."""
        flat = torch.zeros(self.range_size * self.world, dtype=torch.float32,
                           device=self.device)
        offset = 0
        for param, size in zip(self.model_params, self.sizes, strict=True):
            if param.grad is not None:
                flat[offset: offset + size].copy_(param.grad.reshape(-1))
            offset += size
        mine = torch.empty(self.range_size, dtype=torch.float32, device=self.device)
        _reduce_scatter(mine, flat, group=self.group)
        for view, piece in zip(self.views, self.pieces, strict=True):
            view.grad = mine[piece.offset: piece.offset + piece.stop - piece.start].to(
                view.dtype)
        for param in self.model_params:
            param.grad = None

    def local_square_norm(self, counted: Sequence[bool]) -> torch.Tensor:
        """Sum of squares of this rank's gradient pieces whose parameter is `counted`
        (float64, one element): summed over the data-parallel and model-parallel groups it
        is the squared norm of the whole model's gradient."""
        total = torch.zeros(1, dtype=torch.float64, device=self.device)
        for view, piece in zip(self.views, self.pieces, strict=True):
            if counted[piece.index] and view.grad is not None:
                total += view.grad.double().pow(2).sum()
        return total

    def scale_gradients(self, factor: float, only: Sequence[bool] | None = None) -> None:
        """Multiply this rank's gradient pieces by `factor` (those whose parameter is in
        `only`, when given)."""
        for view, piece in zip(self.views, self.pieces, strict=True):
            if view.grad is not None and (only is None or only[piece.index]):
                view.grad.mul_(factor)

    def gather_parameters(self) -> None:
        """Every rank's updated range into every rank's parameters."""
        mine = torch.zeros(self.range_size, dtype=torch.float32, device=self.device)
        for view, piece in zip(self.views, self.pieces, strict=True):
            mine[piece.offset: piece.offset + piece.stop - piece.start].copy_(view.detach())
        flat = torch.empty(self.range_size * self.world, dtype=torch.float32,
                           device=self.device)
        _all_gather(flat, mine, group=self.group)
        offset = 0
        with torch.no_grad():
            for param, size in zip(self.model_params, self.sizes, strict=True):
                param.view(-1).copy_(flat[offset: offset + size])
                offset += size

    # -- the per-parameter form ---------------------------------------------------------------

    def full_state_dict(self) -> dict[str, Any]:
        """AdamW's state as an unsharded ``torch.optim.AdamW`` over the model's parameters
        would hold it (moments gathered over the data-parallel group; zeros before the first
        step). A collective. Transiently holds the model-parallel rank's full moments."""
        gathered: dict[str, list[torch.Tensor]] = {}
        for name in _MOMENTS:
            mine = torch.zeros(self.range_size, dtype=torch.float32, device=self.device)
            for view, piece in zip(self.views, self.pieces, strict=True):
                value = self.state.get(view, {}).get(name)
                if value is not None:
                    mine[piece.offset: piece.offset + piece.stop - piece.start].copy_(value)
            flat = torch.empty(self.range_size * self.world, dtype=torch.float32,
                               device=self.device)
            _all_gather(flat, mine, group=self.group)
            gathered[name] = list(flat[: self.total].split(self.sizes))
        step = self._step_count_tensor()
        state = {index: {"step": step.clone(),
                         **{name: gathered[name][index].view_as(param).clone()
                            for name in _MOMENTS}}
                 for index, param in enumerate(self.model_params)}
        groups = [{key: value for key, value in settings.items() if key != "params"}
                  | {"params": [i for i, g in enumerate(self.group_of) if g == index]}
                  for index, settings in enumerate(self.param_groups)]
        return {"state": state, "param_groups": groups}

    def load_full_state_dict(self, state: dict[str, Any]) -> None:
        """This rank's pieces of a `full_state_dict` (or an unsharded AdamW's state over the
        same parameters, in the same order)."""
        per_param = state["state"]
        for view, piece in zip(self.views, self.pieces, strict=True):
            saved = per_param.get(piece.index)
            if saved is None:
                self.state.pop(view, None)
                continue
            self.state[view] = {
                "step": torch.as_tensor(saved["step"], dtype=torch.float32).clone(),
                **{name: saved[name].reshape(-1)[piece.start: piece.stop].to(
                    self.device, torch.float32).clone() for name in _MOMENTS}}

    def _step_count_tensor(self) -> torch.Tensor:
        """The step AdamW's bias correction is at (the same for every piece, and taken over
        the group so that a rank with an empty range agrees; 0 before the first step)."""
        step = torch.zeros(1, dtype=torch.float64, device=self.device)
        for view in self.views:
            saved = self.state.get(view, {}).get("step")
            if saved is not None:
                step[0] = float(saved)
                break
        dist.all_reduce(step, op=dist.ReduceOp.MAX, group=self.group)
        return torch.tensor(float(step[0]))


def _reduce_scatter(output: torch.Tensor, flat: torch.Tensor, *, group: Any) -> None:
    """Sum `flat` over `group`, this rank receiving its contiguous part (torch >= 2.13
    names it ``reduce_scatter_single``; older releases ``reduce_scatter_tensor``)."""
    collective = getattr(dist, "reduce_scatter_single", None) or dist.reduce_scatter_tensor
    collective(output, flat, group=group)


def _all_gather(flat: torch.Tensor, part: torch.Tensor, *, group: Any) -> None:
    """Every rank's `part`, end to end, into `flat` (``all_gather_single`` from torch 2.13,
    ``all_gather_into_tensor`` before)."""
    collective = getattr(dist, "all_gather_single", None) or dist.all_gather_into_tensor
    collective(flat, part, group=group)


def _pieces(sizes: Sequence[int], first: int, stop: int) -> list[_Piece]:
    """The parts of parameters of `sizes` (laid end to end) inside ``[first, stop)``."""
    pieces = []
    begin = 0
    for index, size in enumerate(sizes):
        end = begin + size
        low, high = max(begin, first), min(end, stop)
        if low < high:
            pieces.append(_Piece(index=index, start=low - begin, stop=high - begin,
                                 offset=low - first))
        begin = end
    return pieces
