from __future__ import annotations

import pytest
import torch

from rlinf.workers.errors import ConfigError
from rlinf.workers.inference import InferenceConfig, LogProbEngine
from rlinf.workers.models import TinyLMConfig, build_tiny_causal_lm
from rlinf.workers.rollout import (
    HFRolloutEngine,
    RolloutGenerator,
    RolloutGeneratorConfig,
    SamplingConfig,
)


def _rollout(model, tokenizer, problems, temperature: float = 1.0):
    engine = HFRolloutEngine(model, eos_token_id=tokenizer.eos_token_id,
                             pad_token_id=tokenizer.pad_token_id)
    config = RolloutGeneratorConfig(group_size=3, groups_per_micro_batch=2, sampling=SamplingConfig(
        max_new_tokens=6, temperature=temperature, seed=1))
    return RolloutGenerator(engine, tokenizer, config=config).generate_batch(problems[:4])


@pytest.mark.parametrize("micro_batch_size", [1, 5, 64])
def test_actor_role_reproduces_the_rollout_log_probs(model, tokenizer, problems,
                                                     micro_batch_size):
    batch = _rollout(model, tokenizer, problems, temperature=0.9)
    worker = LogProbEngine(model, config=InferenceConfig(
        micro_batch_size=micro_batch_size, temperature=0.9))
    annotated = worker.annotate(batch)
    assert annotated.old_log_probs is not None and annotated.ref_log_probs is None
    torch.testing.assert_close(annotated.old_log_probs, batch.rollout_log_probs,
                               atol=1e-5, rtol=0)
    assert (annotated.old_log_probs[~batch.response_mask.bool()] == 0).all()


def test_bf16_scores_near_fp32_and_bad_precision_is_refused(model, tokenizer, problems):
    batch = _rollout(model, tokenizer, problems, temperature=0.9)
    worker = LogProbEngine(model, config=InferenceConfig(temperature=0.9, precision="bf16"))
    scored = worker.compute_log_probs(batch)
    assert scored.dtype == torch.float32
    torch.testing.assert_close(scored, batch.rollout_log_probs, atol=0.1, rtol=0)
    assert not torch.equal(scored, batch.rollout_log_probs)
    with pytest.raises(ConfigError, match="precision"):
        InferenceConfig(precision="fp64")  # type: ignore[arg-type]


def test_reference_role_scores_under_its_own_model(model, tokenizer, problems):
    batch = _rollout(model, tokenizer, problems)
    reference = build_tiny_causal_lm(TinyLMConfig(hidden_size=64, intermediate_size=128,
                                                  attn_implementation="eager"),
                                     seed=9, tokenizer=tokenizer)
    worker = LogProbEngine(reference, config=InferenceConfig(role="reference"))
    annotated = worker.annotate(batch)
    assert annotated.ref_log_probs is not None and annotated.old_log_probs is None
    valid = batch.response_mask.bool()
    assert not torch.allclose(annotated.ref_log_probs[valid], batch.rollout_log_probs[valid])
    # after loading the policy's weights it agrees with the rollout again
    worker.update_weights(model.state_dict().items())
    torch.testing.assert_close(worker.compute_log_probs(batch), batch.rollout_log_probs,
                               atol=1e-5, rtol=0)


def test_offload_onload_round_trip_and_config_errors(model, tokenizer, problems):
    batch = _rollout(model, tokenizer, problems)
    worker = LogProbEngine(model)
    before = worker.compute_log_probs(batch)
    worker.offload()
    worker.onload()
    assert torch.equal(worker.compute_log_probs(batch), before)
    with pytest.raises(ConfigError):
        InferenceConfig(role="critic")  # type: ignore[arg-type]
    with pytest.raises(ConfigError):
        InferenceConfig(micro_batch_size=0)
