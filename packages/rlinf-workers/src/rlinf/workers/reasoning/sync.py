"""The reasoning roles' weight-sync halves: `rlinf.workers.flow.WeightSender` /
`WeightReceiver` on a `ReasoningRole`, exporting from and receiving onto the role's torch
device (CUDA IPC and NCCL on GPU)."""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch
from torch import nn

from rlinf.workers.errors import ConfigError
from rlinf.workers.flow import WeightReceiver, WeightSender
from rlinf.workers.flow.weight_roles import BucketLayout
from rlinf.workers.reasoning.base import ReasoningRole
from rlinf.workers.weight_sync import WeightTarget

if TYPE_CHECKING:
    from rlinf.workers.actor.lora import AdapterTarget

__all__ = ["BucketLayout", "WeightReceiverRole", "WeightSenderRole"]


class WeightSenderRole(ReasoningRole, WeightSender):
    """The actor's half; subclasses implement `buckets` (collective on every actor rank)."""

    @property
    def weight_device(self) -> torch.device:
        """The role's device."""
        return self.device


class WeightReceiverRole(ReasoningRole, WeightReceiver):
    """The rollout's and inference's half; subclasses implement `weight_target`, and
    `adapted_module` where an adapters-only sync (`RoleSetup.lora_adapters`) may reach
    them."""

    _adapters: AdapterTarget | None = None

    @property
    def weight_device(self) -> torch.device:
        """The role's device."""
        return self.device

    def adapted_module(self) -> nn.Module | None:
        """The plain model adapters are merged into (None: this role cannot take them)."""
        return None

    def loading_target(self) -> WeightTarget:
        """`weight_target`, or with `RoleSetup.lora_adapters` an `AdapterTarget` over it
        whose merger copied the adapted layers' base weights at the first sync (every role
        starts from the same base weights, and LoRA never changes them)."""
        lora = self.setup.lora_adapters
        if lora is None:
            return self.weight_target()
        if self._adapters is None:
            # Imported here: the trainer's package stays out of generator processes
            # that never receive adapters.
            from rlinf.workers.actor.lora import AdapterTarget, LoraMerger

            module = self.adapted_module()
            if module is None:
                raise ConfigError(f"the {self.role} role cannot merge LoRA adapters into its "
                                  "model: sync merged weights (RoleSetup.lora_adapters=None)")
            self._adapters = AdapterTarget(self.weight_target(), LoraMerger(module, lora))
        return self._adapters
