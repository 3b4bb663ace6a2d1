"""Padding-free forwards: the packed layout, its numbers against the padded forward, and the
per-model check that falls back to padding."""

from __future__ import annotations

import pytest
import torch
from torch import nn
from transformers import PreTrainedModel

from rlinf.workers.models import (
    TinyLMConfig,
    build_char_tokenizer,
    build_tiny_causal_lm,
    response_log_probs,
    response_log_probs_and_entropy,
)
from rlinf.workers.models.packing import pack_rows, packing_works


def _ragged_batch(rows: int = 12, seed: int = 0) -> dict[str, torch.Tensor]:
    """Left-padded prompts of 1-6 tokens, right-padded responses of 0-10 (ids 3..99)."""
    gen = torch.Generator().manual_seed(seed)
    prompt_lengths = torch.randint(1, 7, (rows,), generator=gen)
    response_lengths = torch.randint(0, 11, (rows,), generator=gen)
    response_lengths[0] = 10  # the widest response sets R
    prompt_mask = (torch.arange(6)[None] >= (6 - prompt_lengths)[:, None]).long()
    response_mask = (torch.arange(10)[None] < response_lengths[:, None]).long()
    return {"prompt_ids": torch.randint(3, 100, (rows, 6), generator=gen) * prompt_mask,
            "prompt_mask": prompt_mask,
            "response_ids": torch.randint(3, 100, (rows, 10), generator=gen) * response_mask,
            "response_mask": response_mask}


def test_rows_are_packed_end_to_end_with_restarting_positions() -> None:
    prompt_ids = torch.tensor([[0, 7, 8], [5, 6, 7], [0, 0, 9]])
    prompt_mask = (prompt_ids > 0).long()
    response_ids = torch.tensor([[11, 12, 0, 0], [13, 14, 15, 16], [17, 0, 0, 0]])
    response_mask = (response_ids > 0).long()
    packed = pack_rows(prompt_ids, prompt_mask, response_ids, response_mask)
    assert packed is not None
    # lengths 4, 7, 2; capacity 7: row 1 alone, then rows 0 and 2 share a packed row
    assert packed.input_ids.tolist() == [[5, 6, 7, 13, 14, 15, 16], [7, 8, 11, 12, 9, 17, 0]]
    assert packed.position_ids.tolist() == [[0, 1, 2, 3, 4, 5, 6], [0, 1, 2, 3, 0, 1, 0]]
    # each response token is predicted by the position before it in its own sequence
    predicted_by = {(int(r), int(c)): (int(pr), int(pc)) for r, c, pr, pc in zip(
        packed.response_rows, packed.response_columns, packed.logit_rows,
        packed.logit_columns, strict=True)}
    assert predicted_by == {(0, 0): (1, 1), (0, 1): (1, 2), (1, 0): (0, 2), (1, 1): (0, 3),
                            (1, 2): (0, 4), (1, 3): (0, 5), (2, 0): (1, 4)}


def test_every_token_lands_once_and_no_packed_row_overflows() -> None:
    batch = _ragged_batch(rows=40, seed=3)
    packed = pack_rows(**batch)
    assert packed is not None
    real = int(batch["prompt_mask"].sum() + batch["response_mask"].sum())
    width = int((batch["prompt_mask"].sum(1) + batch["response_mask"].sum(1)).max())
    assert packed.input_ids.shape[1] == width
    assert int((packed.input_ids > 0).sum()) == real  # every id in the batch is >= 3
    assert packed.cells < 0.95 * 40 * 16


@pytest.mark.parametrize("why", ["holes", "no_prompt", "no_saving"])
def test_packing_declines_layouts_it_cannot_or_need_not_pack(why: str) -> None:
    batch = _ragged_batch()
    if why == "holes":
        batch["response_mask"][1, 0] = 0  # a response that does not start at column 0
        batch["response_mask"][1, 1:] = 1
    elif why == "no_prompt":
        batch["prompt_mask"][2] = 0  # nothing predicts its first response token
        batch["response_mask"][2, 0] = 1
    else:
        batch = {k: v[:1] for k, v in batch.items()}  # one row: packed is as wide as padded
        batch["prompt_mask"][:] = 1
    assert pack_rows(**batch) is None


@pytest.mark.parametrize("kernel", ["eager", "sdpa"])
def test_padding_free_equals_the_padded_forward_and_its_gradients(kernel: str) -> None:
    tokenizer = build_char_tokenizer()
    model = build_tiny_causal_lm(TinyLMConfig(attn_implementation=kernel), seed=0,
                                 tokenizer=tokenizer)
    batch = _ragged_batch()
    assert pack_rows(**batch) is not None

    def run(padding_free: bool) -> tuple[torch.Tensor, torch.Tensor, list[torch.Tensor]]:
        model.zero_grad(set_to_none=True)
        log_probs, entropy = response_log_probs_and_entropy(
            model, temperature=0.8, padding_free=padding_free, **batch)
        (log_probs.sum() + entropy.sum()).backward()
        return log_probs.detach(), entropy.detach(), [p.grad.clone() for p in
                                                      model.parameters()]

    padded, packed = run(False), run(True)
    torch.testing.assert_close(packed[0], padded[0], atol=1e-5, rtol=0)
    torch.testing.assert_close(packed[1], padded[1], atol=1e-5, rtol=0)
    assert (packed[0][batch["response_mask"] == 0] == 0).all()
    for got, expected in zip(packed[2], padded[2], strict=True):
        torch.testing.assert_close(got, expected, atol=1e-4, rtol=1e-3)


class _DropsPositions(nn.Module):
    """A wrapper that loses the position ids: packed sequences would see each other."""

    def __init__(self, inner: PreTrainedModel) -> None:
        super().__init__()
        self.inner = inner

    def get_input_embeddings(self) -> nn.Module:
        return self.inner.get_input_embeddings()

    def forward(self, input_ids: torch.Tensor, **kwargs: object) -> object:
        kwargs.pop("position_ids", None)
        return self.inner(input_ids=input_ids, **kwargs)


def test_a_model_that_ignores_packed_positions_keeps_the_padded_forward(
    tiny_lm: PreTrainedModel,
) -> None:
    assert packing_works(tiny_lm)
    wrapped = _DropsPositions(tiny_lm)
    assert not packing_works(wrapped)
    batch = _ragged_batch()
    with torch.no_grad():
        torch.testing.assert_close(
            response_log_probs(wrapped, padding_free=True, **batch),
            response_log_probs(tiny_lm, padding_free=False, **batch), atol=1e-6, rtol=0)
