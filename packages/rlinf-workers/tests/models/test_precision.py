from __future__ import annotations

import pytest
import torch
from torch import nn

from rlinf.workers.errors import ConfigError
from rlinf.workers.models import check_precision, compute_precision, response_log_probs


def test_bf16_runs_matmuls_in_bfloat16_and_fp32_leaves_them_alone():
    layer = nn.Linear(4, 3)
    x = torch.randn(2, 4)
    with compute_precision("fp32", "cpu"):
        assert layer(x).dtype == torch.float32
    with compute_precision("bf16", torch.device("cpu")):
        assert layer(x).dtype == torch.bfloat16
    assert layer(x).dtype == torch.float32  # nothing leaks out of the block
    assert layer.weight.dtype == torch.float32


def test_unknown_precision_is_refused_with_the_choices():
    assert check_precision("bf16") == "bf16"
    with pytest.raises(ConfigError, match="'fp32' or 'bf16'"):
        check_precision("fp16")
    with pytest.raises(ConfigError), compute_precision("int8", "cpu"):  # type: ignore[arg-type]
        pass


def test_bf16_log_probs_are_float32_and_close_to_fp32(tiny_lm, char_tokenizer):
    prompt = torch.tensor([char_tokenizer.encode("12+34=")])
    response = torch.tensor([char_tokenizer.encode("46")])
    args = {"prompt_ids": prompt, "prompt_mask": torch.ones_like(prompt),
            "response_ids": response, "response_mask": torch.ones_like(response)}
    with torch.no_grad():
        exact = response_log_probs(tiny_lm, **args)
        with compute_precision("bf16", "cpu"):
            approx = response_log_probs(tiny_lm, **args)
    assert approx.dtype == torch.float32
    torch.testing.assert_close(approx, exact, atol=0.1, rtol=0.05)
