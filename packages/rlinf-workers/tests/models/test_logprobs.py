"""The shared response log-prob function agrees with manual computation and with `generate`."""

from __future__ import annotations

import math

import pytest
import torch
from transformers import PreTrainedModel, PreTrainedTokenizerFast

from rlinf.workers.errors import ShapeError
from rlinf.workers.models import (
    position_ids_from_mask,
    response_log_probs,
    response_log_probs_and_entropy,
    response_mask_from_eos,
    token_log_probs,
)


def test_token_log_probs_hand_computed() -> None:
    # softmax([0, ln 3]) = (1/4, 3/4)
    logits = torch.tensor([[0.0, math.log(3)], [0.0, math.log(3)]])
    got = token_log_probs(logits, torch.tensor([1, 0]))
    torch.testing.assert_close(got, torch.tensor([math.log(0.75), math.log(0.25)]))
    with pytest.raises(ShapeError):
        token_log_probs(logits, torch.tensor([1]))


def test_masks_and_positions() -> None:
    ids = torch.tensor([[5, 2, 0, 0], [5, 6, 7, 8], [2, 2, 0, 0]])
    assert response_mask_from_eos(ids, eos_token_id=2).tolist() == [
        [1, 1, 0, 0], [1, 1, 1, 1], [1, 0, 0, 0]]
    assert position_ids_from_mask(torch.tensor([[0, 0, 1, 1, 1]])).tolist() == [[0, 0, 0, 1, 2]]


def _batch(tok: PreTrainedTokenizerFast) -> dict[str, torch.Tensor]:
    prompts = tok(["1+1=", "12+7=", "3="], padding=True, return_tensors="pt")
    responses = torch.tensor([[6, 2, 0], [5, 13, 2], [7, 8, 9]])  # "2<eos>", "19<eos>", "345"
    return {
        "prompt_ids": prompts["input_ids"], "prompt_mask": prompts["attention_mask"],
        "response_ids": responses, "response_mask": response_mask_from_eos(responses,
                                                                           eos_token_id=2),
    }


def test_agrees_with_manual_unpadded_computation(
    tiny_lm: PreTrainedModel, char_tokenizer: PreTrainedTokenizerFast
) -> None:
    batch = _batch(char_tokenizer)
    temperature = 0.7
    with torch.no_grad():
        got = response_log_probs(tiny_lm, temperature=temperature, **batch)
        for row in range(3):
            prompt = batch["prompt_ids"][row][batch["prompt_mask"][row].bool()]
            response = batch["response_ids"][row][batch["response_mask"][row].bool()]
            # one unpadded sequence: default positions 0..L-1, no attention mask at all
            logits = tiny_lm(input_ids=torch.cat([prompt, response])[None]).logits[0]
            predicting = logits[len(prompt) - 1 : len(prompt) - 1 + len(response)]
            expected = torch.log_softmax(predicting / temperature, dim=-1)
            expected = expected[torch.arange(len(response)), response]
            torch.testing.assert_close(got[row, : len(response)], expected, atol=1e-5,
                                       rtol=1e-5)
            assert torch.all(got[row, len(response):] == 0)


def test_agrees_with_generate_scores(
    tiny_lm: PreTrainedModel, char_tokenizer: PreTrainedTokenizerFast
) -> None:
    prompts = char_tokenizer(["1+1=", "12+7="], padding=True, return_tensors="pt")
    with torch.no_grad():
        out = tiny_lm.generate(**prompts, max_new_tokens=5, do_sample=False, output_logits=True,
                               return_dict_in_generate=True)
        response = out.sequences[:, prompts["input_ids"].shape[1]:]
        mask = response_mask_from_eos(response, eos_token_id=char_tokenizer.eos_token_id)
        scores = torch.stack(out.logits, dim=1).log_softmax(-1)
        expected = scores.gather(-1, response.unsqueeze(-1)).squeeze(-1) * mask
        got = response_log_probs(tiny_lm, prompt_ids=prompts["input_ids"],
                                 prompt_mask=prompts["attention_mask"], response_ids=response,
                                 response_mask=mask)
    torch.testing.assert_close(got, expected, atol=1e-4, rtol=1e-4)


def test_micro_batches_entropy_and_gradients(
    tiny_lm: PreTrainedModel, char_tokenizer: PreTrainedTokenizerFast
) -> None:
    batch = _batch(char_tokenizer)
    with torch.no_grad():
        full = response_log_probs(tiny_lm, **batch)
        torch.testing.assert_close(response_log_probs(tiny_lm, micro_batch_size=2, **batch), full)
        log_probs, entropy = response_log_probs_and_entropy(tiny_lm, **batch)
    torch.testing.assert_close(log_probs, full)
    assert torch.all(entropy[batch["response_mask"].bool()] > 0)
    assert torch.all(entropy[~batch["response_mask"].bool()] == 0)
    tiny_lm.zero_grad()
    response_log_probs(tiny_lm, **batch).sum().backward()
    grads = [p.grad for p in tiny_lm.parameters() if p.grad is not None]
    assert grads and any(g.abs().sum() > 0 for g in grads)
    tiny_lm.zero_grad(set_to_none=True)


class _WithoutLogitsToKeep(torch.nn.Module):
    """A causal LM whose forward has no ``logits_to_keep`` (a user's own model)."""

    def __init__(self, inner: PreTrainedModel) -> None:
        super().__init__()
        self.inner = inner

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor,
                position_ids: torch.Tensor, use_cache: bool) -> object:
        return self.inner(input_ids=input_ids, attention_mask=attention_mask,
                          position_ids=position_ids, use_cache=use_cache)


class _Wrapper(torch.nn.Module):
    """Holds the model as ``.module`` and forwards every keyword, as DDP does."""

    def __init__(self, module: torch.nn.Module) -> None:
        super().__init__()
        self.module = module

    def forward(self, **kwargs: object) -> object:
        return self.module(**kwargs)


def test_the_output_head_sees_only_the_positions_that_predict_the_response(
    tiny_lm: PreTrainedModel, char_tokenizer: PreTrainedTokenizerFast
) -> None:
    batch = _batch(char_tokenizer)
    positions: list[int] = []
    hook = tiny_lm.get_output_embeddings().register_forward_hook(
        lambda _module, args, _out: positions.append(args[0].shape[1]))
    try:
        with torch.no_grad():
            kept = response_log_probs(tiny_lm, **batch)
            wrapped = response_log_probs(_Wrapper(tiny_lm), **batch)
            full = response_log_probs(_WithoutLogitsToKeep(tiny_lm), **batch)
    finally:
        hook.remove()
    prompt_len, response_len = batch["prompt_ids"].shape[1], batch["response_ids"].shape[1]
    assert positions == [response_len + 1, response_len + 1, prompt_len + response_len]
    torch.testing.assert_close(kept, full, atol=1e-6, rtol=1e-6)
    torch.testing.assert_close(wrapped, full, atol=1e-6, rtol=1e-6)
