"""`DistributedAdamW` on its own: how ranges cut the parameters, and on a group of one the
same steps and state as torch's AdamW (the multi-rank equivalence is in
test_megatron_actor.py, modes ``-dopt``)."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
import torch
import torch.distributed as dist
from torch import nn

from rlinf.workers.actor.megatron.distributed_optimizer import DistributedAdamW, _pieces


@pytest.mark.parametrize("world", [1, 2, 3, 7, 40])
def test_ranges_cover_every_element_once(world: int) -> None:
    sizes = [6, 1, 9, 4]
    total = sum(sizes)
    per = -(-total // world)
    covered = torch.zeros(total, dtype=torch.int64)
    for rank in range(world):
        first = min(rank * per, total)
        for piece in _pieces(sizes, first, min(first + per, total)):
            begin = sum(sizes[: piece.index])
            covered[begin + piece.start: begin + piece.stop] += 1
            assert 0 <= piece.offset < per
    assert torch.equal(covered, torch.ones(total, dtype=torch.int64))


@pytest.fixture
def group_of_one() -> Iterator[None]:
    dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    try:
        yield
    finally:
        dist.destroy_process_group()


def _params(seed: int) -> list[nn.Parameter]:
    gen = torch.Generator().manual_seed(seed)
    return [nn.Parameter(torch.randn(shape, generator=gen)) for shape in ((3, 4), (5,), (2, 2))]


def test_steps_like_adamw_and_round_trips_its_state(group_of_one: None) -> None:
    ours, theirs = _params(0), _params(0)
    sharded = DistributedAdamW(ours, group=dist.group.WORLD, lr=0.1, betas=(0.9, 0.99),
                               weight_decay=0.01)
    plain = torch.optim.AdamW(theirs, lr=0.1, betas=(0.9, 0.99), weight_decay=0.01)
    gen = torch.Generator().manual_seed(1)
    for _ in range(3):
        for mine, other in zip(ours, theirs, strict=True):
            grad = torch.randn(mine.shape, generator=gen)
            mine.grad, other.grad = grad.clone(), grad.clone()
        sharded.reduce_scatter_gradients()
        assert all(p.grad is None for p in ours)  # the full gradients are dropped
        sharded.step()
        sharded.gather_parameters()
        plain.step()
        for mine, other in zip(ours, theirs, strict=True):
            torch.testing.assert_close(mine, other, rtol=0, atol=1e-6)
    # The per-parameter form is torch AdamW's state dict; loading it back is exact.
    full = sharded.full_state_dict()
    want = plain.state_dict()
    for index in range(len(ours)):
        for key in ("exp_avg", "exp_avg_sq", "step"):
            torch.testing.assert_close(full["state"][index][key], want["state"][index][key])
    fresh = DistributedAdamW(_params(0), group=dist.group.WORLD, lr=0.1, betas=(0.9, 0.99),
                             weight_decay=0.01)
    fresh.load_full_state_dict(want)
    for view, again in zip(sharded.views, fresh.views, strict=True):
        for key in ("exp_avg", "exp_avg_sq", "step"):
            torch.testing.assert_close(sharded.state[view][key], fresh.state[again][key])


def test_the_norm_counts_only_the_parameters_it_is_told_to(group_of_one: None) -> None:
    params = _params(0)
    sharded = DistributedAdamW(params, group=dist.group.WORLD, lr=0.1, betas=(0.9, 0.99),
                               weight_decay=0.0)
    for param in params:
        param.grad = torch.ones_like(param)
    sharded.reduce_scatter_gradients()
    assert float(sharded.local_square_norm([True, False, True])) == 12 + 4
    sharded.scale_gradients(0.5)
    assert float(sharded.local_square_norm([True, True, True])) == pytest.approx(21 / 4)


def test_parameter_groups_step_at_their_own_rates(group_of_one: None) -> None:
    """PPO's critic as a second group: each group at its own rate, as torch's AdamW with the
    same groups; the per-parameter form keeps the groups; scaling can spare a group."""
    ours, theirs = _params(0), _params(0)
    sharded = DistributedAdamW([{"params": ours[:2]}, {"params": ours[2:], "lr": 0.5}],
                               group=dist.group.WORLD, lr=0.1, betas=(0.9, 0.99),
                               weight_decay=0.0)
    plain = torch.optim.AdamW([{"params": theirs[:2]}, {"params": theirs[2:], "lr": 0.5}],
                              lr=0.1, betas=(0.9, 0.99), weight_decay=0.0)
    before = [p.detach().clone() for p in ours]
    for mine, other in zip(ours, theirs, strict=True):
        mine.grad, other.grad = torch.ones_like(mine), torch.ones_like(other)
    sharded.reduce_scatter_gradients()
    sharded.scale_gradients(0.5, only=[False, False, True])
    assert float(sharded.local_square_norm([True, True, True])) == 12 + 5 + 4 * 0.25
    sharded.step()
    sharded.gather_parameters()
    plain.step()
    # Adam's first step is lr * sign(g): 0.1 for the first group, 0.5 for the second
    for param, old, lr in zip(ours, before, (0.1, 0.1, 0.5), strict=True):
        torch.testing.assert_close(old - param.detach(), torch.full_like(old, lr))
    for mine, other in zip(ours, theirs, strict=True):
        torch.testing.assert_close(mine, other, rtol=0, atol=1e-6)
    groups = sharded.full_state_dict()["param_groups"]
    assert [(g["params"], g["lr"]) for g in groups] == [([0, 1], 0.1), ([2], 0.5)]
    assert len(plain.state_dict()["param_groups"]) == 2
