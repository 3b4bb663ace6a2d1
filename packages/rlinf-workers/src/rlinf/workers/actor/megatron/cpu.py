"""Run megatron-core's GPT layers on CPU (gloo), where it was written for CUDA only.

Where megatron-core 0.16 stops on a CPU-only torch, found by running a TP=2 and a PP=2
GPT on two gloo ranks (the tests do the same):

1. Tensors are allocated on ``torch.cuda.current_device()`` (rotary embeddings, pipeline
   receive buffers, ~170 sites). `enable_cpu_execution` points that call at the CPU,
   where it would otherwise raise.
2. Dropout inside tensor-parallel regions forks CUDA RNG states
   (``tensor_parallel.get_cuda_rng_tracker``). `enable_cpu_execution` installs a tracker
   with the same named, seeded streams on the CPU generator.
3. The default causal mask is built with ``device="cuda"``: the actor always passes its
   own mask (padding included), so that code never runs.
4. The pipeline schedules (``get_forward_backward_func``) count tokens in a tensor made
   with ``device="cuda"``: the actor runs its own schedule (`pipeline.py`).
5. A tied embedding split across pipeline stages is copied to the last stage with
   ``.cuda()`` (``setup_embeddings_and_output_layer``): the actor builds that stage with
   its own copy of the weights and adds the two copies' gradients itself.
6. Its distributed checkpoints synchronise CUDA streams after copying to the host
   (``torch.cuda.synchronize``): without CUDA there is nothing to wait for, and
   `enable_cpu_execution` makes that call return.
7. The distributed optimizer accepts only ``torch.cuda.*Tensor`` parameters
   (``_build_model_and_main_param_groups``) and needs megatron's DDP grad buffers: the
   actor's `DistributedAdamW` runs the same algorithm with torch collectives instead.
8. Sequence parallelism is refused by the torch-norm wrapper of the local layer spec (only
   Transformer Engine's norms, CUDA builds, allow it): the actor builds its layers with its
   own RMSNorm (`model.rms_norm`).

Only ever called where CUDA is absent, so no GPU process is changed by it.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

import torch

__all__ = ["enable_cpu_execution"]


def enable_cpu_execution() -> None:
    """Make megatron-core's CUDA-only calls (1, 2 and 6 above) work on CPU; a no-op where
    CUDA is available, idempotent."""
    if torch.cuda.is_available():
        return
    torch.cuda.current_device = _cpu_device  # type: ignore[assignment]
    torch.cuda.synchronize = _nothing_to_wait_for  # type: ignore[assignment]
    from megatron.core.tensor_parallel import random as megatron_random

    if not getattr(megatron_random._CUDA_RNG_STATE_TRACKER, "on_cpu", False):
        megatron_random._CUDA_RNG_STATE_TRACKER = _cpu_rng_tracker()
        megatron_random._CUDA_RNG_STATE_TRACKER_INITIALIZED = True


def _cpu_device() -> torch.device:
    return torch.device("cpu")


def _nothing_to_wait_for(device: Any = None) -> None:
    return None


def _cpu_rng_tracker() -> Any:
    """megatron-core's RNG tracker on the CPU generator: each named stream is a saved CPU
    generator state, swapped in and out by `fork` as the CUDA tracker does. (Defined here:
    megatron-core is an extra, imported only when the Megatron actor is built.)"""
    from megatron.core.tensor_parallel.random import CudaRNGStatesTracker

    class CpuRngStatesTracker(CudaRNGStatesTracker):  # type: ignore[misc]
        on_cpu = True

        def add(self, name: str, seed: int) -> None:
            if seed in self.seeds_:
                raise ValueError(f"seed {seed} already exists")
            if name in self.states_:
                raise ValueError(f"rng state {name} already exists")
            self._is_initialized = True
            self.seeds_.add(seed)
            generator = torch.Generator()
            generator.manual_seed(seed)
            self.states_[name] = generator.get_state()

        @contextlib.contextmanager
        def fork(self, name: str = "model-parallel-rng") -> Iterator[None]:
            if name not in self.states_:
                raise ValueError(f"rng state {name} is not added")
            outer = torch.get_rng_state()
            torch.set_rng_state(self.states_[name])
            try:
                yield
            finally:
                self.states_[name] = torch.get_rng_state()
                torch.set_rng_state(outer)

    return CpuRngStatesTracker()
