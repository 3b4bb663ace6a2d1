"""Per-token log-probs of responses given prompts: the ONE function rollout, inference and
actor all call, so the three agree bit for bit on the same weights.

Batch layout (the one `generate` produces): prompts left-padded ``[B, P]``, responses
right-padded ``[B, R]``; the model sees ``concat(prompt, response)``. Position ids restart at
0 at each row's first valid token, exactly as Hugging Face ``generate`` computes them, so a
left-padded row scores the same as the same row without padding. Logits are divided by the
sampling temperature before the softmax: the log-probs are those of the distribution the
rollout sampled from.
"""

from __future__ import annotations

import inspect
from collections.abc import Iterator

import torch
from torch import nn

from rlinf.workers.algorithms.losses import entropy_from_logits
from rlinf.workers.errors import ConfigError, ShapeError
from rlinf.workers.models.packing import pack_rows, packed_response_logits, packing_works

__all__ = [
    "position_ids_from_mask",
    "response_log_probs",
    "response_log_probs_and_entropy",
    "response_logits",
    "response_mask_from_eos",
    "token_log_probs",
]


def token_log_probs(logits: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    """``log softmax(logits)[..., label]``: ``[..., V]`` logits and ``[...]`` labels → ``[...]``."""
    if tuple(logits.shape[:-1]) != tuple(labels.shape):
        raise ShapeError(
            f"logits {tuple(logits.shape)} must be labels {tuple(labels.shape)} plus a vocab dim"
        )
    # logsumexp + gather avoids materialising a second [..., V] tensor of log-probs.
    picked = logits.gather(-1, labels.long().unsqueeze(-1)).squeeze(-1)
    return picked - torch.logsumexp(logits, dim=-1)


def position_ids_from_mask(attention_mask: torch.Tensor) -> torch.Tensor:
    """Positions counting valid tokens from 0 (padding gets 0), as ``generate`` assigns them."""
    positions = attention_mask.long().cumsum(dim=-1) - 1
    return positions.clamp(min=0)


def response_mask_from_eos(response_ids: torch.Tensor, *, eos_token_id: int) -> torch.Tensor:
    """1 for every response token up to and including the first EOS, 0 after it.

    Rows without EOS (cut at the length limit) are valid to the end.
    """
    is_eos = (response_ids == eos_token_id).long()
    eos_before = is_eos.cumsum(dim=-1) - is_eos  # EOS tokens strictly before each position
    return (eos_before == 0).long()


def _check_layout(
    prompt_ids: torch.Tensor, prompt_mask: torch.Tensor,
    response_ids: torch.Tensor, response_mask: torch.Tensor, temperature: float,
) -> None:
    if prompt_ids.shape != prompt_mask.shape or response_ids.shape != response_mask.shape:
        raise ShapeError(
            f"ids and masks must match: prompt {tuple(prompt_ids.shape)} vs "
            f"{tuple(prompt_mask.shape)}, response {tuple(response_ids.shape)} vs "
            f"{tuple(response_mask.shape)}"
        )
    if prompt_ids.ndim != 2 or response_ids.ndim != 2 or len(prompt_ids) != len(response_ids):
        raise ShapeError(
            f"expected prompt [B, P] and response [B, R] with one B, got "
            f"{tuple(prompt_ids.shape)} and {tuple(response_ids.shape)}"
        )
    if prompt_ids.shape[1] < 1:
        raise ShapeError("prompts must have at least one position (the first response token "
                         "is predicted from the last prompt token)")
    if temperature <= 0:
        raise ConfigError(f"temperature must be > 0, got {temperature}")


def response_logits(
    model: nn.Module,
    *,
    prompt_ids: torch.Tensor,
    prompt_mask: torch.Tensor,
    response_ids: torch.Tensor,
    response_mask: torch.Tensor,
    temperature: float = 1.0,
    padding_free: bool = False,
) -> torch.Tensor:
    """Temperature-scaled logits that predict each response token, ``[B, R, V]``.

    With `padding_free`, the rows' real tokens are packed end to end and padding is not
    computed (`rlinf.workers.models.packing`), where the model honours packed sequences
    and that saves positions. Otherwise, where the model's forward takes
    ``logits_to_keep`` (transformers' causal LMs do), only the last ``R + 1`` positions go
    through the output head: the prompt's logits are never used, and with a 150k vocabulary
    and long prompts they are most of the head's work and of the activation memory the
    backward pass keeps.
    """
    _check_layout(prompt_ids, prompt_mask, response_ids, response_mask, temperature)
    if padding_free and packing_works(getattr(model, "module", model)):
        packed = pack_rows(prompt_ids, prompt_mask, response_ids, response_mask)
        if packed is not None:
            rows, columns = response_ids.shape
            logits = packed_response_logits(model, packed, response_shape=(rows, columns))
            return logits.float() / temperature
    input_ids = torch.cat([prompt_ids, response_ids], dim=1)
    attention_mask = torch.cat([prompt_mask, response_mask], dim=1)
    # A padding id may be outside the vocabulary (e.g. -100); masked positions never count.
    input_ids = torch.where(attention_mask.bool(), input_ids, torch.zeros_like(input_ids))
    prompt_len, response_len = prompt_ids.shape[1], response_ids.shape[1]
    keep = {"logits_to_keep": response_len + 1} if _keeps_logits(model) else {}
    out = model(
        input_ids=input_ids,
        attention_mask=attention_mask,
        position_ids=position_ids_from_mask(attention_mask),
        use_cache=False,
        **keep,
    )
    # The logit at position i predicts token i + 1: response token j is predicted at P-1+j,
    # which is row j of the last R + 1 positions.
    first = 0 if keep else prompt_len - 1
    logits = out.logits[:, first : first + response_len, :]
    return logits.float() / temperature


_TAKES_LOGITS_TO_KEEP: dict[type, bool] = {}
"""Per model class: whether its forward has a ``logits_to_keep`` parameter."""


def _keeps_logits(model: nn.Module) -> bool:
    """Whether `model` (or the module a DDP/FSDP wrapper holds) takes ``logits_to_keep``."""
    inner: nn.Module = getattr(model, "module", model)
    cls = type(inner)
    if cls not in _TAKES_LOGITS_TO_KEEP:
        try:
            names = set(inspect.signature(cls.forward).parameters)
        except (TypeError, ValueError):
            names = set()
        _TAKES_LOGITS_TO_KEEP[cls] = "logits_to_keep" in names
    return _TAKES_LOGITS_TO_KEEP[cls]


def response_log_probs(
    model: nn.Module,
    *,
    prompt_ids: torch.Tensor,
    prompt_mask: torch.Tensor,
    response_ids: torch.Tensor,
    response_mask: torch.Tensor,
    temperature: float = 1.0,
    micro_batch_size: int | None = None,
    padding_free: bool = False,
) -> torch.Tensor:
    """Log-prob of each response token under `model`, ``[B, R]``; 0 at padded positions.

    Differentiable (the actor trains through it); wrap in ``torch.no_grad()`` for
    inference. `micro_batch_size` bounds the rows in one forward pass (peak memory);
    `padding_free` as in `response_logits`.
    """
    chunks = _chunks(model, prompt_ids=prompt_ids, prompt_mask=prompt_mask,
                     response_ids=response_ids, response_mask=response_mask,
                     temperature=temperature, micro_batch_size=micro_batch_size,
                     padding_free=padding_free)
    return torch.cat([token_log_probs(logits, labels) * mask for logits, labels, mask in chunks])


def response_log_probs_and_entropy(
    model: nn.Module,
    *,
    prompt_ids: torch.Tensor,
    prompt_mask: torch.Tensor,
    response_ids: torch.Tensor,
    response_mask: torch.Tensor,
    temperature: float = 1.0,
    micro_batch_size: int | None = None,
    padding_free: bool = False,
) -> tuple[torch.Tensor, torch.Tensor]:
    """`response_log_probs` plus the per-token entropy of the same distribution, both ``[B, R]``."""
    log_probs: list[torch.Tensor] = []
    entropies: list[torch.Tensor] = []
    chunks = _chunks(model, prompt_ids=prompt_ids, prompt_mask=prompt_mask,
                     response_ids=response_ids, response_mask=response_mask,
                     temperature=temperature, micro_batch_size=micro_batch_size,
                     padding_free=padding_free)
    for logits, labels, mask in chunks:
        log_probs.append(token_log_probs(logits, labels) * mask)
        entropies.append(entropy_from_logits(logits) * mask)
    return torch.cat(log_probs), torch.cat(entropies)


def _chunks(
    model: nn.Module, *, prompt_ids: torch.Tensor, prompt_mask: torch.Tensor,
    response_ids: torch.Tensor, response_mask: torch.Tensor, temperature: float,
    micro_batch_size: int | None, padding_free: bool,
) -> Iterator[tuple[torch.Tensor, torch.Tensor, torch.Tensor]]:
    """(logits, labels, float mask) per micro-batch of rows; labels are 0 at padding."""
    rows = len(prompt_ids)
    step = rows if micro_batch_size is None else micro_batch_size
    if step < 1:
        raise ConfigError(f"micro_batch_size must be >= 1, got {micro_batch_size}")
    for start in range(0, max(rows, 1), step):
        part = slice(start, start + step)
        logits = response_logits(
            model, prompt_ids=prompt_ids[part], prompt_mask=prompt_mask[part],
            response_ids=response_ids[part], response_mask=response_mask[part],
            temperature=temperature, padding_free=padding_free,
        )
        valid = response_mask[part].bool()
        labels = torch.where(valid, response_ids[part], torch.zeros_like(response_ids[part]))
        yield logits, labels, valid.to(logits.dtype)
