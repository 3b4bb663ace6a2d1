from __future__ import annotations

import pytest
import torch

from rlinf.workers.errors import ConfigError
from rlinf.workers.models import (
    GQA_SDPA,
    TinyLMConfig,
    attention_kernel,
    build_tiny_causal_lm,
    check_attention,
    generation_attention,
    response_log_probs,
    training_attention,
)

CPU, GPU = torch.device("cpu"), torch.device("cuda")


@pytest.mark.parametrize(("choice", "precision", "device", "kernel"), [
    ("auto", "bf16", CPU, "eager"),
    ("auto", "fp32", CPU, None),
    ("auto", "bf16", GPU, None),
    ("model", "bf16", CPU, None),
    ("sdpa", "bf16", CPU, "sdpa"),
    ("eager", "fp32", GPU, "eager"),
])
def test_training_attention_picks_eager_only_for_bf16_on_cpu(choice, precision, device,
                                                             kernel):
    # One choice per run: no micro-batch's width can make it differ between the training
    # forward and the inference pass that gave the old log-probs.
    assert training_attention(choice, precision=precision, device=device) == kernel


def test_unknown_choices_are_refused_with_the_choices_named():
    assert check_attention("auto") == "auto"
    with pytest.raises(ConfigError, match=r"attention must be one of .*'flash'"):
        check_attention("flash")


def _model(attn: str = "sdpa") -> torch.nn.Module:
    return build_tiny_causal_lm(TinyLMConfig(hidden_size=64, num_heads=4, num_kv_heads=2,
                                             intermediate_size=128, attn_implementation=attn),
                                seed=0)


def test_the_kernel_runs_inside_and_the_models_own_is_restored_even_on_error():
    model = _model()
    seen: list[str] = []
    model.model.layers[0].self_attn.register_forward_hook(
        lambda module, args, out: seen.append(module.config._attn_implementation))
    ids = torch.randint(1, 90, (2, 5))
    with attention_kernel(model, "eager"):
        model(input_ids=ids)
    model(input_ids=ids)
    assert seen == ["eager", "sdpa"]
    with pytest.raises(RuntimeError), attention_kernel(model, "eager"):
        raise RuntimeError("a failing forward")
    assert model.config._attn_implementation == "sdpa"
    with attention_kernel(model, None):
        assert model.config._attn_implementation == "sdpa"


def test_a_module_without_a_transformers_config_is_left_alone():
    module = torch.nn.Linear(3, 3)
    with attention_kernel(module, "eager"):
        assert module(torch.ones(3)).shape == (3,)


def test_eager_and_sdpa_give_the_same_log_probs_with_padding():
    model = _model()
    prompt_ids = torch.randint(1, 90, (3, 6))
    prompt_mask = torch.ones_like(prompt_ids)
    prompt_mask[0, :2] = 0  # left padding
    response_ids = torch.randint(1, 90, (3, 4))
    response_mask = torch.ones_like(response_ids)
    response_mask[1, 2:] = 0
    args = {"prompt_ids": prompt_ids, "prompt_mask": prompt_mask,
            "response_ids": response_ids, "response_mask": response_mask}
    with torch.no_grad():
        own = response_log_probs(model, **args)
        with attention_kernel(model, "eager"):
            eager = response_log_probs(model, **args)
    torch.testing.assert_close(eager, own, atol=1e-5, rtol=1e-5)


def test_generation_reads_grouped_heads_in_place_on_cpu_only():
    model = _model()
    assert model.config.num_key_value_heads < model.config.num_attention_heads
    assert generation_attention(model, device=CPU) == GQA_SDPA
    assert generation_attention(model, device=GPU) is None
    with attention_kernel(model, "eager"):  # a kernel the user chose is kept
        assert generation_attention(model, device=CPU) is None


def test_grouped_sdpa_decodes_as_sdpa_does_with_left_padding():
    """Prefill and cached decoding steps under a padding mask: the same logits as
    transformers' sdpa, which copies the grouped heads per query head."""
    model = _model()
    ids = torch.randint(1, 90, (3, 6))
    mask = torch.ones_like(ids)
    mask[0, :2] = 0
    mask[2, :1] = 0

    def decode() -> torch.Tensor:
        out = model(input_ids=ids, attention_mask=mask, use_cache=True)
        logits, cache, step_mask = [out.logits[:, -1]], out.past_key_values, mask
        for _ in range(3):
            token = logits[-1].argmax(-1, keepdim=True)
            step_mask = torch.cat([step_mask, torch.ones_like(token)], dim=1)
            out = model(input_ids=token, attention_mask=step_mask, past_key_values=cache,
                        use_cache=True)
            logits.append(out.logits[:, -1])
            cache = out.past_key_values
        return torch.stack(logits, dim=1)

    with torch.no_grad():
        own = decode()
        with attention_kernel(model, generation_attention(model, device=CPU)):
            grouped = decode()
    torch.testing.assert_close(grouped, own, atol=1e-5, rtol=1e-5)


def test_grouped_sdpa_generates_as_sdpa_does_with_a_static_cache():
    """An unpadded batch into a preallocated cache: the prefill comes without a mask."""
    model = _model()
    ids = torch.randint(1, 90, (2, 5))
    options = {"max_new_tokens": 4, "do_sample": False, "cache_implementation": "static",
               "return_dict_in_generate": True, "output_logits": True, "pad_token_id": 0}
    with torch.no_grad():
        own = model.generate(input_ids=ids, **options)
        with attention_kernel(model, generation_attention(model, device=CPU)):
            grouped = model.generate(input_ids=ids, **options)
    torch.testing.assert_close(torch.stack(grouped.logits), torch.stack(own.logits),
                               atol=1e-5, rtol=1e-5)
