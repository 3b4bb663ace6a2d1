"""Hugging Face ↔ megatron-core weights: every cut gives back the same state dict."""

from __future__ import annotations

import dataclasses

import pytest
import torch

from rlinf.workers.actor.megatron import (
    MegatronConfig,
    ModelShape,
    hf_to_megatron,
    megatron_to_hf,
    shards_to_hf,
)
from rlinf.workers.errors import ConfigError
from rlinf.workers.models import TinyLMConfig, build_tiny_causal_lm

CONFIG = TinyLMConfig(vocab_size=96, hidden_size=48, num_layers=4, num_heads=6, num_kv_heads=2,
                      intermediate_size=64)


@pytest.mark.parametrize("tied", [True, False])
@pytest.mark.parametrize(("tp", "pp"), [(1, 1), (2, 1), (1, 2), (2, 2), (1, 4)])
def test_every_cut_round_trips(tied: bool, tp: int, pp: int) -> None:
    model = build_tiny_causal_lm(dataclasses.replace(CONFIG, tie_word_embeddings=tied), seed=1)
    shape = ModelShape.from_hf(model.config)
    shape.check(MegatronConfig(tensor_parallel=tp, pipeline_parallel=pp))
    hf = model.state_dict()
    stages = [[hf_to_megatron(hf, shape, tp_rank=r, tp_size=tp,
                              layers=shape.stage_layers(pp, s), first_stage=s == 0,
                              last_stage=s == pp - 1) for r in range(tp)] for s in range(pp)]
    back = megatron_to_hf(stages, shape)
    assert set(back) == set(hf)
    for name, tensor in hf.items():
        assert torch.equal(back[name], tensor), name


def test_qkv_is_grouped_as_megatron_lays_it_out() -> None:
    model = build_tiny_causal_lm(CONFIG, seed=1)
    shape = ModelShape.from_hf(model.config)
    hf = model.state_dict()
    fused = hf_to_megatron(hf, shape, tp_rank=0, tp_size=1, layers=range(1), first_stage=True,
                           last_stage=False)["decoder.layers.0.self_attention.linear_qkv.weight"]
    d = shape.head_dim
    q = hf["model.layers.0.self_attn.q_proj.weight"]
    k = hf["model.layers.0.self_attn.k_proj.weight"]
    # Group 0: query heads 0-2, then key head 0, then value head 0.
    assert torch.equal(fused[:3 * d], q[:3 * d])
    assert torch.equal(fused[3 * d:4 * d], k[:d])
    # Group 1 starts after group 0's 5 heads.
    assert torch.equal(fused[5 * d:8 * d], q[3 * d:6 * d])


def test_cuts_that_do_not_divide_the_model_are_refused() -> None:
    shape = ModelShape.from_hf(build_tiny_causal_lm(CONFIG, seed=1).config)
    with pytest.raises(ConfigError, match="num_key_value_heads"):
        shape.check(MegatronConfig(tensor_parallel=4))
    with pytest.raises(ConfigError, match="num_hidden_layers"):
        shape.check(MegatronConfig(pipeline_parallel=3))
    with pytest.raises(ConfigError, match="multiple of 4"):
        MegatronConfig(tensor_parallel=2, pipeline_parallel=2).data_parallel(6)
    assert MegatronConfig(tensor_parallel=2).data_parallel(6) == 3
    with pytest.raises(ConfigError, match=">= 1"):
        MegatronConfig(tensor_parallel=0)


def test_other_families_and_missing_weights_are_refused() -> None:
    class GPT2Like:
        model_type = "gpt2"

    with pytest.raises(ConfigError, match="Qwen2 and Llama"):
        ModelShape.from_hf(GPT2Like())
    shape = ModelShape.from_hf(build_tiny_causal_lm(CONFIG, seed=1).config)
    with pytest.raises(ConfigError, match=r"model\.embed_tokens\.weight"):
        hf_to_megatron({}, shape, tp_rank=0, tp_size=1, layers=range(0), first_stage=True,
                       last_stage=False)


def test_shards_in_any_order_reassemble_and_a_missing_one_is_named() -> None:
    model = build_tiny_causal_lm(CONFIG, seed=1)
    shape = ModelShape.from_hf(model.config)
    hf = model.state_dict()
    shards = [(s, r, hf_to_megatron(hf, shape, tp_rank=r, tp_size=2,
                                    layers=shape.stage_layers(2, s), first_stage=s == 0,
                                    last_stage=s == 1)) for s in range(2) for r in range(2)]
    back = shards_to_hf(reversed(shards), shape, tensor_parallel=2, pipeline_parallel=2)
    assert all(torch.equal(back[name], tensor) for name, tensor in hf.items())
    with pytest.raises(ConfigError, match=r"\[\(1, 0\)\]"):
        shards_to_hf([x for x in shards if x[:2] != (1, 0)], shape, tensor_parallel=2,
                     pipeline_parallel=2)
