"""How the embodied roles' weights travel: as numpy arrays to the driver (`weights_to_wire`,
`weights_from_wire`), and into a rollout policy as a weight-sync target (`PolicyTarget`)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Protocol

import numpy as np
import torch

from rlinf.workers.weight_sync import Bucket

__all__ = ["PolicyTarget", "Weights", "weights_from_wire", "weights_to_wire"]

Weights = Mapping[str, "np.ndarray | torch.Tensor"]
"""Parameters as they travel to the driver: numpy arrays (Ray's object store hands them
over without pickling the data; torch tensors it copies), torch tensors where numpy has no
dtype for them (bfloat16)."""


def weights_to_wire(weights: Mapping[str, torch.Tensor]) -> dict[str, np.ndarray | torch.Tensor]:
    """CPU numpy copies of `weights` (tensors numpy cannot hold stay tensors)."""
    return {k: v.detach().cpu().numpy() if v.dtype != torch.bfloat16 else v.detach().cpu()
            for k, v in weights.items()}


def weights_from_wire(weights: Weights) -> dict[str, torch.Tensor]:
    """Torch tensors owning their memory (received arrays may be read-only views)."""
    return {k: v if isinstance(v, torch.Tensor) else torch.tensor(v) for k, v in weights.items()}


class _LoadsWeights(Protocol):
    def set_weights(self, weights: Mapping[str, torch.Tensor]) -> None: ...


class PolicyTarget:
    """A rollout policy as a weight-sync target (`rlinf.workers.weight_sync.WeightTarget`):
    each bucket is a complete state dict (`EmbodiedActorRole.buckets` sends one bucket)."""

    def __init__(self, policy: _LoadsWeights) -> None:
        self._policy = policy

    def update_weights(self, named_tensors: Bucket) -> None:
        """Load the bucket (the policy copies it into its own parameters)."""
        self._policy.set_weights(dict(named_tensors))
