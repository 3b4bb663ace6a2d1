"""A token-level value model for PPO on LLMs: a causal-LM trunk plus a scalar head.

The value of response token j is read at the position that *predicts* it (``P - 1 + j``),
the same alignment as the policy's logits, so ``V[j]`` is the value of the state in which
token j is chosen.
"""

from __future__ import annotations

import copy

import torch
from torch import nn

from rlinf.workers.models import position_ids_from_mask

__all__ = ["TokenValueModel", "build_critic_from_policy"]


class TokenValueModel(nn.Module):
    """Wraps a Hugging Face causal LM; `forward` returns per-response-token values."""

    def __init__(self, trunk: nn.Module, hidden_size: int) -> None:
        super().__init__()
        self.trunk = trunk
        self.value_head = nn.Linear(hidden_size, 1)
        # A zero head starts every value at 0: GAE then begins as plain returns.
        nn.init.zeros_(self.value_head.weight)
        nn.init.zeros_(self.value_head.bias)

    def forward(
        self, *, prompt_ids: torch.Tensor, prompt_mask: torch.Tensor,
        response_ids: torch.Tensor, response_mask: torch.Tensor,
    ) -> torch.Tensor:
        """``[B, R]`` values (0 on padding)."""
        input_ids = torch.cat([prompt_ids, response_ids], dim=1)
        attention_mask = torch.cat([prompt_mask, response_mask], dim=1)
        input_ids = torch.where(attention_mask.bool(), input_ids, torch.zeros_like(input_ids))
        out = self.trunk(input_ids=input_ids, attention_mask=attention_mask,
                         position_ids=position_ids_from_mask(attention_mask),
                         output_hidden_states=True, use_cache=False)
        hidden = out.hidden_states[-1]
        start, length = prompt_ids.shape[1] - 1, response_ids.shape[1]
        values = self.value_head(hidden[:, start:start + length].float()).squeeze(-1)
        return values * response_mask.to(values.dtype)


def build_critic_from_policy(policy: nn.Module) -> TokenValueModel:
    """A critic whose trunk starts as a copy of the policy (the usual PPO-for-LLM init)."""
    trunk = copy.deepcopy(policy)
    hidden = int(trunk.config.hidden_size)  # type: ignore[union-attr,arg-type]
    critic = TokenValueModel(trunk, hidden)
    return critic.to(next(policy.parameters()).device)
