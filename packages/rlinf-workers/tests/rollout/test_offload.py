"""What a component keeps resident: `state_bytes` counts each storage once."""

from __future__ import annotations

import torch
from torch import nn

from rlinf.workers.rollout.offload import discard_module, state_bytes


def test_state_bytes_counts_parameters_gradients_and_optimizer_state_once() -> None:
    model = nn.Linear(4, 3)  # 12 weights + 3 biases, float32
    params = 15 * 4
    assert state_bytes(model) == params
    assert state_bytes(model, model, None) == params  # the same storage counts once
    optimizer = torch.optim.Adam(model.parameters())
    model(torch.ones(2, 4)).sum().backward()
    optimizer.step()
    # gradients + Adam's two moments (the scalar step counters are tiny tensors too)
    steps = sum(s["step"].untyped_storage().nbytes() for s in optimizer.state.values())
    assert state_bytes(model, optimizer) == params * 4 + steps


def test_tied_weights_and_discarded_storage() -> None:
    embed = nn.Embedding(10, 4)
    head = nn.Linear(4, 10, bias=False)
    head.weight = embed.weight
    tied = nn.ModuleDict({"embed": embed, "head": head})
    assert state_bytes(tied) == 40 * 4
    discard_module(tied)
    assert state_bytes(tied) == 0
