"""SGLang engine: GPU only. The real test runs where a GPU and sglang are present."""

from __future__ import annotations

import importlib.util

import pytest
import torch

from rlinf.workers.models import TinyLMConfig, build_tiny_causal_lm, response_log_probs
from rlinf.workers.rollout import RolloutBatch, RolloutError, SamplingConfig, SglangRolloutEngine

HAS_GPU = torch.cuda.is_available()
HAS_SGLANG = importlib.util.find_spec("sglang") is not None


@pytest.mark.skipif(HAS_GPU, reason="checks the CPU refusal")
def test_sglang_refuses_to_start_without_a_gpu(tmp_path):
    with pytest.raises(RolloutError, match="CUDA GPU"):
        SglangRolloutEngine(str(tmp_path))


@pytest.mark.gpu
@pytest.mark.skipif(not (HAS_GPU and HAS_SGLANG), reason="needs a CUDA GPU and sglang")
def test_sglang_generates_and_follows_weight_updates(tmp_path, tokenizer):
    config = TinyLMConfig(hidden_size=128, num_heads=4, intermediate_size=128)
    model = build_tiny_causal_lm(config, seed=0, tokenizer=tokenizer)
    model.save_pretrained(tmp_path)
    tokenizer.save_pretrained(tmp_path)
    engine = SglangRolloutEngine(str(tmp_path), dtype="bfloat16")
    prompts = [tokenizer.encode(t) for t in ("12+7=", "3-4=")]
    greedy = SamplingConfig(max_new_tokens=6, temperature=0.0)
    try:
        other = build_tiny_causal_lm(config, seed=7, tokenizer=tokenizer).cuda()
        engine.update_weights(other.state_dict().items())
        samples = engine.generate(prompts, sampling=greedy)
        batch = RolloutBatch.from_samples(samples, answers=["0", "0"], group_size=1,
                                          pad_token_id=tokenizer.pad_token_id)
        with torch.no_grad():
            expected = response_log_probs(
                other, prompt_ids=batch.prompt_ids.cuda(), prompt_mask=batch.prompt_mask.cuda(),
                response_ids=batch.response_ids.cuda(),
                response_mask=batch.response_mask.cuda())
        # bfloat16 engine vs float32 reference: agreement to bf16 precision
        torch.testing.assert_close(batch.rollout_log_probs, expected.cpu(), atol=0.1, rtol=0)
        engine.offload()
        engine.onload()
        engine.update_weights(other.state_dict().items())
        assert engine.generate(prompts, sampling=greedy) == samples
    finally:
        engine.shutdown()
