"""A 1F1B pipeline schedule over megatron-core GPT stages, with point-to-point sends.

Stage ``s`` receives micro-batch ``i``'s hidden states from ``s - 1``, runs its layers and
sends them on; the last stage turns them into a loss, and the gradients flow back the same
way. Stage ``s`` first runs ``pp - s - 1`` forwards, then alternates one forward and one
backward, then runs the backwards left (PipeDream-flush / Megatron's 1F1B): the bubble is
``pp - 1`` slots per step, and at most ``pp - s`` micro-batches' activations are alive on a
stage whatever the number of micro-batches. Every stage knows each micro-batch's shape
(the data-parallel group's ranks all hold the batch), so nothing but activations and
their gradients crosses.

megatron-core's own schedules (``get_forward_backward_func``) allocate on 'cuda'
unconditionally (`cpu.py`), so this one runs everywhere and is what the actor uses.
Activations cross in fp32 whatever the autocast dtype, so every stage agrees on it.
"""

from __future__ import annotations

import collections
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

    def hidden_shape(self, hidden_size: int, sequence_shards: int = 1) -> tuple[int, int, int]:
        """Shape of the hidden states between stages: ``[s / sequence_shards, b, hidden]``
        (under sequence parallelism each tensor-parallel rank passes its share of the
        sequence)."""
        rows, length = self.tokens.shape
        return (length // sequence_shards, rows, hidden_size)


LossFn = Callable[[torch.Tensor, int], torch.Tensor | None]
"""The last stage's ``(logits, micro-batch index) -> scalar loss`` (None: forward only)."""


def run_stages(model: nn.Module, inputs: Sequence[StageInput], loss_fn: LossFn, *,
               hidden_size: int, device: torch.device, forward_only: bool = False,
               sequence_shards: int = 1) -> None:
    """Run `inputs` through this rank's stage of `model` (a megatron GPTModel built with
    this stage's ``pre_process``/``post_process``) and, unless `forward_only`, back, in the
    1F1B order (module docstring). Gradients accumulate in the parameters; the last stage
    calls `loss_fn` per micro-batch (also when `forward_only`, to collect its outputs).
    `sequence_shards`: the tensor-parallel degree under sequence parallelism, else 1."""
    from megatron.core import parallel_state as ps

    stages = _Stages(model, inputs, loss_fn, hidden_size=hidden_size, device=device,
                     forward_only=forward_only, sequence_shards=sequence_shards,
                     previous=None if ps.is_pipeline_first_stage()
                     else ps.get_pipeline_model_parallel_prev_rank(),
                     following=None if ps.is_pipeline_last_stage()
                     else ps.get_pipeline_model_parallel_next_rank())
    count = len(inputs)
    if forward_only:
        for index in range(count):
            with torch.no_grad():
                stages.forward(index)
        stages.finish()
        return
    # Stage s runs pp - s - 1 forwards ahead, then one forward and one backward in turn,
    # then the backwards left: at most pp - s micro-batches are alive on it.
    warmup = min(ps.get_pipeline_model_parallel_world_size()
                 - ps.get_pipeline_model_parallel_rank() - 1, count)
    for index in range(warmup):
        stages.forward(index)
    for index in range(warmup, count):
        stages.forward(index)
        stages.backward()
    for _ in range(warmup):
        stages.backward()
    stages.finish()


class _Stages:
    """One rank's forwards and backwards of the schedule, and the sends still in flight.

    Sends are asynchronous (``isend``) and receives block: a stage that sends a forward
    output while its neighbour sends it a gradient cannot deadlock, and each pair's
    messages arrive in the order they were sent."""

    def __init__(self, model: nn.Module, inputs: Sequence[StageInput], loss_fn: LossFn, *,
                 hidden_size: int, device: torch.device, forward_only: bool,
                 sequence_shards: int, previous: int | None, following: int | None) -> None:
        self.model, self.inputs, self.loss_fn = model, inputs, loss_fn
        self.sequence_shards = sequence_shards
        self.hidden_size, self.device, self.forward_only = hidden_size, device, forward_only
        self.previous, self.following = previous, following
        self.alive: collections.deque[tuple[torch.Tensor | None, torch.Tensor | None]] = \
            collections.deque()
        self.sending: list[tuple[torch.Tensor, object]] = []

    def forward(self, index: int) -> None:
        item = self.inputs[index]
        received = None
        if self.previous is not None:
            received = torch.empty(item.hidden_shape(self.hidden_size, self.sequence_shards),
                                   dtype=torch.float32, device=self.device)
            _recv(received, self.previous)
            received.requires_grad_(not self.forward_only)
        _set_input(self.model, received)
        output = self.model(item.tokens, item.positions, attention_mask=item.mask)
        if self.following is not None:
            self._send(output.detach().float(), self.following)
            result = output
        else:
            result = self.loss_fn(output, index)
            if result is None and not self.forward_only:
                result = output.sum() * 0.0  # the previous stages wait for a gradient
        if not self.forward_only:
            self.alive.append((received, result))

    def backward(self) -> None:
        received, result = self.alive.popleft()
        assert result is not None  # every training micro-batch has a loss (see forward)
        if self.following is None:
            result.backward()
        else:
            grad = torch.empty(result.shape, dtype=torch.float32, device=self.device)
            _recv(grad, self.following)
            result.backward(grad.to(result.dtype))
        if self.previous is not None:
            if received is None or received.grad is None:
                raise RuntimeError("a pipeline stage's input received no gradient")
            self._send(received.grad.float(), self.previous)

    def _send(self, tensor: torch.Tensor, peer: int) -> None:
        import torch.distributed as dist

        tensor = tensor.contiguous()
        self.sending.append((tensor, dist.isend(tensor, dst=peer)))

    def finish(self) -> None:
        """Wait for every send (the buffers stay referenced until then)."""
        for _, request in self.sending:
            request.wait()  # type: ignore[attr-defined]
        self.sending.clear()


def _set_input(model: nn.Module, tensor: torch.Tensor | None) -> None:
    """Hand the previous stage's output to this stage (megatron's ``set_input_tensor``)."""
    inner = getattr(model, "module", model)
    getattr(inner, "set_input_tensor")(tensor)  # noqa: B009 (a megatron method, untyped)


def _recv(tensor: torch.Tensor, peer: int) -> None:
    import torch.distributed as dist

    dist.recv(tensor, src=peer)
