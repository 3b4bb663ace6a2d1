"""The reasoning roles' weight-sync halves: `rlinf.workers.flow.WeightSender` /
`WeightReceiver` on a `ReasoningRole`, exporting from and receiving onto the role's torch
device (CUDA IPC and NCCL on GPU)."""

from __future__ import annotations

import torch

from rlinf.workers.flow import BucketLayout, WeightReceiver, WeightSender
from rlinf.workers.reasoning.base import ReasoningRole

__all__ = ["BucketLayout", "WeightReceiverRole", "WeightSenderRole"]


class WeightSenderRole(ReasoningRole, WeightSender):
    """The actor's half; subclasses implement `buckets` (collective on every actor rank)."""

    @property
    def weight_device(self) -> torch.device:
        """The role's device."""
        return self.device


class WeightReceiverRole(ReasoningRole, WeightReceiver):
    """The rollout's and inference's half; subclasses implement `weight_target`."""

    @property
    def weight_device(self) -> torch.device:
        """The role's device."""
        return self.device
