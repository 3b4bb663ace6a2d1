"""A pipeline schedule over megatron-core GPT stages, with blocking point-to-point sends.

All forwards, then all backwards (GPipe): stage ``s`` receives micro-batch ``i``'s hidden
states from ``s - 1``, runs its layers, sends them on; the last stage turns them into a
loss, and the gradients flow back the same way, micro-batch by micro-batch. Every stage
knows each micro-batch's shape (the data-parallel group's ranks all hold the batch), so
nothing but the activations crosses. The bubble is that of 1F1B; the activation memory is
that of all micro-batches of a mini-batch at once (1F1B keeps at most ``stages`` of them).

megatron-core's own schedules (``get_forward_backward_func``) allocate on 'cuda'
unconditionally (`cpu.py`), so this one runs everywhere and is what the actor uses.
Activations cross in fp32 whatever the autocast dtype, so every stage agrees on it.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

import torch
from torch import nn

__all__ = ["StageInput", "run_stages"]


@dataclass(frozen=True)
class StageInput:
    """One micro-batch as a GPT stage takes it."""

    tokens: torch.Tensor
    """``[b, s]`` token ids (0 at padding)."""
    positions: torch.Tensor
    """``[b, s]`` position ids."""
    mask: torch.Tensor
    """``[b, 1, s, s]`` bool, True where attention is masked out."""

    def hidden_shape(self, hidden_size: int) -> tuple[int, int, int]:
        """Shape of the hidden states between stages: ``[s, b, hidden]``."""
        rows, length = self.tokens.shape
        return (length, rows, hidden_size)


LossFn = Callable[[torch.Tensor, int], torch.Tensor | None]
"""The last stage's ``(logits, micro-batch index) -> scalar loss`` (None: forward only)."""


def run_stages(model: nn.Module, inputs: Sequence[StageInput], loss_fn: LossFn, *,
               hidden_size: int, device: torch.device,
               forward_only: bool = False) -> None:
    """Run `inputs` through this rank's stage of `model` (a megatron GPTModel built with
    this stage's ``pre_process``/``post_process``) and, unless `forward_only`, back.
    Gradients accumulate in the parameters; the last stage calls `loss_fn` per
    micro-batch (also when `forward_only`, to collect its outputs)."""
    from megatron.core import parallel_state as ps

    first = ps.is_pipeline_first_stage()
    last = ps.is_pipeline_last_stage()
    previous = None if first else ps.get_pipeline_model_parallel_prev_rank()
    following = None if last else ps.get_pipeline_model_parallel_next_rank()
    kept: list[tuple[torch.Tensor | None, torch.Tensor | None]] = []
    grad_mode = torch.no_grad() if forward_only else torch.enable_grad()
    with grad_mode:
        for index, item in enumerate(inputs):
            received = None
            if previous is not None:
                received = torch.empty(item.hidden_shape(hidden_size),
                                       dtype=torch.float32, device=device)
                _recv(received, previous)
                received.requires_grad_(not forward_only)
            _set_input(model, received)
            output = model(item.tokens, item.positions, attention_mask=item.mask)
            if following is not None:
                _send(output.detach().float(), following)
                kept.append((received, output))
            else:
                loss = loss_fn(output, index)
                if loss is None and not forward_only:
                    loss = output.sum() * 0.0  # the previous stages wait for a gradient
                kept.append((received, loss))
    if forward_only:
        return
    for received, result in kept:
        assert result is not None  # every training micro-batch has a loss (see above)
        if following is None:
            result.backward()
        else:
            grad = torch.empty(result.shape, dtype=torch.float32, device=device)
            _recv(grad, following)
            result.backward(grad.to(result.dtype))
        if previous is not None:
            if received is None or received.grad is None:
                raise RuntimeError("a pipeline stage's input received no gradient")
            _send(received.grad.float(), previous)


def _set_input(model: nn.Module, tensor: torch.Tensor | None) -> None:
    """Hand the previous stage's output to this stage (megatron's ``set_input_tensor``)."""
    inner = getattr(model, "module", model)
    getattr(inner, "set_input_tensor")(tensor)  # noqa: B009 (a megatron method, untyped)


def _send(tensor: torch.Tensor, peer: int) -> None:
    import torch.distributed as dist

    dist.send(tensor.contiguous(), dst=peer)


def _recv(tensor: torch.Tensor, peer: int) -> None:
    import torch.distributed as dist

    dist.recv(tensor, src=peer)
