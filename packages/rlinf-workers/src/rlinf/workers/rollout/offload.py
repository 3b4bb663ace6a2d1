"""Move a module's parameters and an optimizer's state off the device and back.

Two policies, because what "free the device" means depends on what must survive:

- ``host``: copy tensors to CPU memory and back (GPU → CPU → GPU). Nothing is lost; on a
  CPU-only worker there is nothing to free, so it is a no-op there.
- ``discard``: resize the parameters' storage to zero bytes and re-allocate it on onload.
  The memory really is returned (also on CPU), and the values must be
  reloaded afterwards — right for a rollout engine, whose weights are overwritten by the
  next weight sync anyway.
"""

from __future__ import annotations

from typing import Literal

import torch
from torch import nn

__all__ = [
    "OffloadPolicy",
    "discard_module",
    "empty_device_cache",
    "materialize_module",
    "move_module",
    "move_optimizer_state",
    "state_bytes",
]

OffloadPolicy = Literal["host", "discard"]


def state_bytes(*parts: nn.Module | torch.optim.Optimizer | None) -> int:
    """Bytes a component keeps while resident: parameters, buffers and gradients of the
    modules, and the optimizers' state tensors; storage shared between parts (tied weights,
    a policy copy that aliases the actor) counts once. `None` parts are skipped."""
    seen: set[tuple[str, int]] = set()
    total = 0

    def add(tensor: torch.Tensor | None) -> None:
        nonlocal total
        if tensor is None:
            return
        storage = tensor.untyped_storage()
        key = (str(tensor.device), storage.data_ptr())
        if storage.nbytes() and key not in seen:
            seen.add(key)
            total += storage.nbytes()

    for part in parts:
        if isinstance(part, nn.Module):
            for tensor in [*part.parameters(), *part.buffers()]:
                add(tensor)
                add(tensor.grad)
        elif isinstance(part, torch.optim.Optimizer):
            for state in part.state.values():
                for value in state.values():
                    if isinstance(value, torch.Tensor):
                        add(value)
    return total

def empty_device_cache(device: torch.device) -> None:
    """Return cached allocator blocks to the driver so other components can use them."""
    if device.type == "cuda":
        torch.cuda.synchronize(device)
        torch.cuda.empty_cache()


def move_module(module: nn.Module, device: torch.device | str) -> None:
    """Move parameters, buffers and gradients of `module` to `device` in place.

    ``param.data`` is swapped rather than ``module.to`` so the Parameter objects — which an
    optimizer and DDP hold references to — stay the same.
    """
    target = torch.device(device)
    for tensor in [*module.parameters(), *module.buffers()]:
        if tensor.device != target:
            tensor.data = tensor.data.to(target, non_blocking=False)
        grad = tensor.grad
        if grad is not None and grad.device != target:
            tensor.grad = grad.to(target)


def move_optimizer_state(optimizer: torch.optim.Optimizer, device: torch.device | str) -> None:
    """Move every tensor of the optimizer's per-parameter state to `device`.

    Scalar ``step`` counters stay where torch keeps them (CPU for AdamW unless capturable).
    """
    target = torch.device(device)
    for state in optimizer.state.values():
        for key, value in list(state.items()):
            if isinstance(value, torch.Tensor) and value.ndim > 0 and value.device != target:
                state[key] = value.to(target)


def discard_module(module: nn.Module) -> int:
    """Free every parameter's storage (shapes and Parameter objects stay); returns the
    bytes freed.

    The storage is resized to 0 bytes, as FSDP does with unsharded parameters, so the
    optimizer/engine references stay valid and `materialize_module` can give the memory
    back in place. Buffers stay: they are small and some (rotary frequencies) are not in
    the state dict, so a weight sync could not restore them.
    """
    freed = 0
    for param in module.parameters():  # yields a tied parameter once
        storage = param.data.untyped_storage()
        freed += storage.nbytes()
        storage.resize_(0)
        param.grad = None
    return freed


def materialize_module(module: nn.Module) -> None:
    """Re-allocate (uninitialised) storage for parameters freed by `discard_module`."""
    for param in module.parameters():
        storage = param.data.untyped_storage()
        if storage.nbytes() == 0 and param.numel() > 0:
            storage.resize_(param.numel() * param.element_size())
