"""PPO's critic on megatron-core: a GPT stage of the policy's cut whose output layer is a
scalar value head.

It is the Megatron form of `rlinf.workers.actor.critic.TokenValueModel`: the trunk starts
as a copy of the policy (the same Hugging Face weights, cut the same way), and the head
reads the final norm's hidden state at every position, starting at zero so that GAE begins
as plain returns. The head is one ``hidden -> 1`` linear map, replicated on every
tensor-parallel rank: a value is one number per token, so there is nothing to split.

Every tensor-parallel rank then computes every value and the same value loss, as each
computes the same policy loss from its share of the vocabulary. Under sequence parallelism
a rank holds its share of the sequence after the final norm: it computes the values of
that share and the ranks gather them (one number per token crosses, not the hidden state;
the gather's backward hands each rank its own share's gradient). The head's gradient is
then a partial sum over the tokens the rank saw, and its parameters are tagged
``sequence_parallel`` for the trainer to sum them over the tensor-parallel group, as it
does the norms'.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

from rlinf.workers.actor.megatron.layout import MegatronConfig, ModelShape
from rlinf.workers.actor.megatron.model import build_stage

__all__ = ["ValueHead", "build_value_stage"]


class ValueHead(nn.Module):
    """``[s, b, hidden] -> [s, b, 1]`` values in fp32, called as megatron's GPTModel calls
    its output layer (``(hidden, weight=..., runtime_gather_output=...) -> (out, bias)``)."""

    def __init__(self, hidden_size: int, *, sequence_parallel: bool) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.zeros(1, hidden_size))
        self.bias = nn.Parameter(torch.zeros(1))
        self.sequence_parallel = sequence_parallel
        for param in (self.weight, self.bias):
            param.sequence_parallel = sequence_parallel  # type: ignore[attr-defined]

    def forward(self, hidden: torch.Tensor, weight: torch.Tensor | None = None,
                runtime_gather_output: Any = None) -> tuple[torch.Tensor, None]:
        # `weight` is the tied embedding GPTModel would hand a language-model head: unused.
        values = nn.functional.linear(hidden.float(), self.weight, self.bias)
        if self.sequence_parallel:
            from megatron.core.tensor_parallel.mappings import (
                gather_from_sequence_parallel_region,
            )

            values = gather_from_sequence_parallel_region(values,
                                                          tensor_parallel_output_grad=False)
        return values, None


def build_value_stage(hf_model: nn.Module, shape: ModelShape, config: MegatronConfig, *,
                      device: torch.device) -> nn.Module:
    """This rank's stage of the critic (after `initialize_parallel`): `build_stage` of
    `hf_model`, the last stage's output layer replaced by a zero `ValueHead`. Its forward
    returns ``[b, s, 1]`` values on the last stage."""
    from megatron.core import parallel_state as ps

    model: Any = build_stage(hf_model, shape, config, device=device)
    if ps.is_pipeline_last_stage():
        model.output_layer = ValueHead(shape.hidden_size,
                                       sequence_parallel=config.sequence_parallel).to(device)
    # The head is no language-model head: nothing is tied to the embedding.
    model.share_embeddings_and_output_weights = False
    return model  # type: ignore[no-any-return]
