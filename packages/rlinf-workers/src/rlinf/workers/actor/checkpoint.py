"""Actor checkpoints: model(s), optimizer, RNG states and step, one file per rank.

Model and optimizer states go through `torch.distributed.checkpoint.state_dict`, which
resolves DDP and FSDP2 wrappers and keys the optimizer state by parameter names; with
``full_state_dict`` every rank writes (and later reads) complete tensors, so a checkpoint
does not depend on how the parameters were sharded.
"""

from __future__ import annotations

import os
import random
from collections.abc import Mapping
from pathlib import Path
from types import ModuleType
from typing import Any

import numpy as np
import torch
import torch.distributed as dist
from torch import nn

from rlinf.workers.errors import ConfigError

__all__ = ["load", "read_rank_file", "read_rank_files", "restore", "rng_state", "save",
           "set_rng_state"]


def _state_dict_api() -> tuple[ModuleType, Any]:
    """`torch.distributed.checkpoint.state_dict` and the options every call passes, imported
    on first use: the import (DTensor and its ops) is paid by processes that save
    or restore, not by every process that imports the actor package for its config."""
    from torch.distributed.checkpoint import state_dict as api

    # Not cpu_offload: combined with full_state_dict it leaves every rank but 0 with an
    # empty dict, and each rank here writes (and later reads) its own complete file.
    return api, api.StateDictOptions(full_state_dict=True)


def _to_cpu(value: Any) -> Any:
    if isinstance(value, torch.Tensor):
        return value.detach().cpu()
    if isinstance(value, dict):
        return {k: _to_cpu(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return type(value)(_to_cpu(v) for v in value)
    return value


def _rank() -> int:
    return dist.get_rank() if dist.is_available() and dist.is_initialized() else 0


def rng_state() -> dict[str, Any]:
    """Python, numpy, torch CPU and (if any) CUDA RNG states."""
    return {
        "python": random.getstate(),
        "numpy": np.random.get_state(),
        "torch": torch.get_rng_state(),
        "cuda": torch.cuda.get_rng_state_all() if torch.cuda.is_available() else None,
    }


def set_rng_state(state: dict[str, Any]) -> None:
    """Inverse of `rng_state`."""
    random.setstate(state["python"])
    np.random.set_state(state["numpy"])
    torch.set_rng_state(state["torch"])
    if state["cuda"] is not None and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])


def save(directory: str | os.PathLike[str], *, modules: nn.Module,
         optimizer: torch.optim.Optimizer, step: int,
         layout: Mapping[str, Any] | None = None,
         extra: Mapping[str, Any] | None = None) -> Path:
    """Write ``rank{r}.pt`` under `directory` (created); returns its path. `layout` says
    how this rank's tensors are cut, for readers that reassemble them (`read_layout`);
    `extra` is the trainer's other state (plain values; `read_rank_file` gives it back).
    An optimizer whose ``state_by_position`` is true (its parameters are not the modules',
    e.g. the Megatron actor's `DistributedAdamW`) is saved by its own ``state_dict``."""
    api, options = _state_dict_api()
    if getattr(optimizer, "state_by_position", False):
        model_state = api.get_model_state_dict(modules, options=options)
        optim_state = optimizer.state_dict()
    else:
        model_state, optim_state = api.get_state_dict(modules, optimizer, options=options)
    path = Path(directory) / f"rank{_rank()}.pt"
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".tmp")
    torch.save({"model": _to_cpu(model_state), "optimizer": _to_cpu(optim_state),
                "rng": rng_state(),
                "step": step, "layout": dict(layout or {}), "extra": dict(extra or {})}, tmp)
    tmp.replace(path)  # atomic: a crash mid-write never leaves a truncated checkpoint
    return path


def read_rank_files(directory: str | os.PathLike[str]) -> list[dict[str, Any]]:
    """Every rank's file of a checkpoint `directory` (model, layout, step; no optimizer
    state), in rank order."""
    paths = sorted(Path(directory).glob("rank*.pt"), key=lambda p: int(p.stem[4:]))
    if not paths:
        raise ConfigError(f"{directory} holds no rank*.pt checkpoint files")
    out = []
    for path in paths:
        # Memory-mapped: the optimizer state each file also holds is never read.
        state = torch.load(path, weights_only=False, map_location="cpu", mmap=True)
        out.append({"model": state["model"], "layout": state.get("layout") or {},
                    "step": state["step"]})
    return out


def read_rank_file(directory: str | os.PathLike[str], *,
                   any_replica: bool = False) -> dict[str, Any]:
    """This rank's file of a checkpoint `directory`, as `save` wrote it (tensors on CPU).

    `any_replica`: the ranks are data-parallel replicas of one complete state, so a rank
    the checkpoint has no file for — a run relaunched on more ranks than it saved from, as
    ``auto``'s re-plan does — reads rank 0's (the one file complete under every backend)."""
    path = Path(directory) / f"rank{_rank()}.pt"
    if not path.is_file() and any_replica and (Path(directory) / "rank0.pt").is_file():
        path = Path(directory) / "rank0.pt"
    if not path.is_file():
        raise ConfigError(f"no checkpoint for rank {_rank()} at {path}")
    # Our own file: RNG states need pickle.
    return dict(torch.load(path, weights_only=False, map_location="cpu"))


def restore(state: dict[str, Any], *, modules: nn.Module,
            optimizer: torch.optim.Optimizer) -> int:
    """Apply a rank file read by `read_rank_file`; returns its step. set_state_dict copies
    the CPU tensors into the (possibly sharded, possibly GPU) parameters and optimizer
    state."""
    api, options = _state_dict_api()
    if getattr(optimizer, "state_by_position", False):
        api.set_model_state_dict(modules, state["model"], options=options)
        optimizer.load_state_dict(state["optimizer"])
    else:
        api.set_state_dict(modules, optimizer, model_state_dict=state["model"],
                           optim_state_dict=state["optimizer"], options=options)
    set_rng_state(state["rng"])
    return int(state["step"])


def load(directory: str | os.PathLike[str], *, modules: nn.Module,
         optimizer: torch.optim.Optimizer) -> int:
    """Restore this rank's file from `directory`; returns the saved step."""
    return restore(read_rank_file(directory), modules=modules, optimizer=optimizer)
