"""Masked statistics over padded batches: the building blocks of every loss and advantage.

A mask marks valid entries with 1 (or a non-negative weight) and padding with 0. Reductions
over an all-zero mask return 0, never NaN, so an empty micro-batch cannot poison a step.
"""

from __future__ import annotations

import torch

from rlinf.workers.errors import ShapeError

__all__ = ["check_same_shape", "masked_mean", "masked_sum", "masked_var", "masked_whiten"]


def check_same_shape(**tensors: torch.Tensor) -> None:
    """Raise `ShapeError` unless every tensor has the same shape (names go in the message)."""
    shapes = {name: tuple(t.shape) for name, t in tensors.items()}
    if len(set(shapes.values())) > 1:
        listed = ", ".join(f"{name}={shape}" for name, shape in shapes.items())
        raise ShapeError(f"expected tensors of one shape, got {listed}")


def masked_sum(
    values: torch.Tensor, mask: torch.Tensor, *, dim: int | tuple[int, ...] | None = None
) -> torch.Tensor:
    """Sum of `values * mask` over `dim` (all dimensions when None)."""
    check_same_shape(values=values, mask=mask)
    weighted = values * mask.to(values.dtype)
    return weighted.sum() if dim is None else weighted.sum(dim=dim)


def masked_mean(
    values: torch.Tensor, mask: torch.Tensor, *, dim: int | tuple[int, ...] | None = None
) -> torch.Tensor:
    """Weighted mean `sum(values * mask) / sum(mask)`; 0 where the mask sums to 0."""
    total = masked_sum(values, mask, dim=dim)
    mask_f = mask.to(values.dtype)
    count = mask_f.sum() if dim is None else mask_f.sum(dim=dim)
    return torch.where(count > 0, total / count.clamp(min=torch.finfo(values.dtype).tiny), 0.0)


def masked_var(values: torch.Tensor, mask: torch.Tensor, *, unbiased: bool = True) -> torch.Tensor:
    """Variance of the masked entries (all dimensions); Bessel-corrected when `unbiased`.

    With fewer than two valid entries the unbiased variance is undefined; 0 is returned.
    """
    mean = masked_mean(values, mask)
    var = masked_mean((values - mean) ** 2, mask)
    if not unbiased:
        return var
    count = mask.to(values.dtype).sum()
    return torch.where(count > 1, var * count / (count - 1).clamp(min=1.0), 0.0)


def masked_whiten(
    values: torch.Tensor, mask: torch.Tensor, *, shift_mean: bool = True, eps: float = 1e-8
) -> torch.Tensor:
    """Normalise the masked entries to unit variance (and zero mean when `shift_mean`).

    Padding positions come back as 0. Uses the unbiased variance, like PPO implementations
    that whiten advantages across a batch.
    """
    mean = masked_mean(values, mask)
    var = masked_var(values, mask, unbiased=True)
    whitened = (values - mean) * torch.rsqrt(var + eps)
    if not shift_mean:
        whitened = whitened + mean
    return whitened * mask.to(values.dtype)
