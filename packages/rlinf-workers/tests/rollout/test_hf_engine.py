from __future__ import annotations

import copy

import pytest
import torch

from rlinf.workers.errors import ConfigError
from rlinf.workers.models import (
    TinyLMConfig,
    build_tiny_causal_lm,
    compute_precision,
    response_log_probs,
)
from rlinf.workers.rollout import HFRolloutEngine, RolloutBatch, RolloutError, SamplingConfig


def _engine(model, tokenizer) -> HFRolloutEngine:
    return HFRolloutEngine(model, eos_token_id=tokenizer.eos_token_id,
                           pad_token_id=tokenizer.pad_token_id)


def _prompts(tokenizer) -> list[list[int]]:
    return [tokenizer.encode(t) for t in ("12+7=", "3-4=", "99+99=")]


def test_seeded_sampling_is_reproducible_and_seeds_differ(model, tokenizer):
    engine = _engine(model, tokenizer)
    sampling = SamplingConfig(max_new_tokens=6, seed=3)
    first = engine.generate(_prompts(tokenizer), sampling=sampling)
    again = engine.generate(_prompts(tokenizer), sampling=sampling)
    other = engine.generate(_prompts(tokenizer), sampling=SamplingConfig(max_new_tokens=6, seed=4))
    assert first == again
    assert [s.response_token_ids for s in first] != [s.response_token_ids for s in other]
    assert all(len(s.response_token_ids) == 6 and s.finish_reason == "length" for s in first)


@pytest.mark.parametrize("temperature", [0.0, 0.7, 1.3])
def test_log_probs_match_the_shared_log_prob_function(model, tokenizer, temperature):
    engine = _engine(model, tokenizer)
    sampling = SamplingConfig(max_new_tokens=5, temperature=temperature, top_k=20, seed=0)
    samples = engine.generate(_prompts(tokenizer), sampling=sampling)
    batch = RolloutBatch.from_samples(samples, answers=["0"] * 3, group_size=1,
                                      pad_token_id=tokenizer.pad_token_id)
    with torch.no_grad():
        expected = response_log_probs(
            model, prompt_ids=batch.prompt_ids, prompt_mask=batch.prompt_mask,
            response_ids=batch.response_ids, response_mask=batch.response_mask,
            temperature=sampling.logprob_temperature)
    torch.testing.assert_close(batch.rollout_log_probs, expected, atol=1e-5, rtol=0)
    assert (batch.rollout_log_probs[batch.response_mask.bool()] < 0).all()


def test_log_probs_without_kept_logits_are_the_same(model, tokenizer):
    # A zero budget forces the memory-bounded path: one extra forward pass instead of
    # keeping every step's logits (what a large vocabulary needs).
    sampling = SamplingConfig(max_new_tokens=6, temperature=0.9, seed=5)
    kept = _engine(model, tokenizer).generate(_prompts(tokenizer), sampling=sampling)
    lean = HFRolloutEngine(model, eos_token_id=tokenizer.eos_token_id,
                           pad_token_id=tokenizer.pad_token_id, logits_budget_bytes=0)
    recomputed = lean.generate(_prompts(tokenizer), sampling=sampling)
    assert [s.response_token_ids for s in recomputed] == [s.response_token_ids for s in kept]
    for a, b in zip(recomputed, kept, strict=True):
        assert a.log_probs == pytest.approx(b.log_probs, abs=1e-5)


def test_bf16_generation_serves_bf16_weights_with_log_probs_near_the_trainers(model, tokenizer):
    engine = HFRolloutEngine(copy.deepcopy(model), eos_token_id=tokenizer.eos_token_id,
                             pad_token_id=tokenizer.pad_token_id, precision="bf16")
    assert {p.dtype for p in engine.model.parameters()} == {torch.bfloat16}
    assert {b.dtype for b in engine.model.buffers()} == {b.dtype for b in model.buffers()}
    sampling = SamplingConfig(max_new_tokens=5, temperature=0.9, seed=2)
    samples = engine.generate(_prompts(tokenizer), sampling=sampling)
    batch = RolloutBatch.from_samples(samples, answers=["0"] * 3, group_size=1,
                                      pad_token_id=tokenizer.pad_token_id)
    args = {"prompt_ids": batch.prompt_ids, "prompt_mask": batch.prompt_mask,
            "response_ids": batch.response_ids, "response_mask": batch.response_mask,
            "temperature": sampling.logprob_temperature}
    with torch.no_grad(), compute_precision("bf16", "cpu"):
        trainer_bf16 = response_log_probs(model, **args)
    with torch.no_grad():
        fp32 = response_log_probs(model, **args)
    # the rollout-trainer mismatch of a bf16 engine (vLLM's with dtype=bfloat16 alike)
    torch.testing.assert_close(batch.rollout_log_probs, trainer_bf16, atol=3e-2, rtol=0)
    torch.testing.assert_close(batch.rollout_log_probs, fp32, atol=0.1, rtol=0)
    # fp32 updates are cast on copy; the parameters stay bf16
    name, weight = next(iter(model.state_dict().items()))
    engine.update_weights([(name, weight + 1.0)])
    served = engine.model.state_dict()[name]
    assert served.dtype == torch.bfloat16
    torch.testing.assert_close(served, (weight + 1.0).to(torch.bfloat16))
    with pytest.raises(ConfigError, match="precision"):
        HFRolloutEngine(model, eos_token_id=tokenizer.eos_token_id,
                        pad_token_id=tokenizer.pad_token_id, precision="fp8")


def test_bf16_generation_casts_no_weight(model, tokenizer):
    """Under autocast over fp32 weights every matmul casts its activations, and under
    inference_mode every weight too, at every token; a bf16 engine casts none."""
    from torch.profiler import profile

    engine = HFRolloutEngine(model, eos_token_id=tokenizer.eos_token_id,
                             pad_token_id=tokenizer.pad_token_id, precision="bf16")
    weight_shapes = {tuple(p.shape) for p in model.parameters() if p.dim() == 2}
    with profile(record_shapes=True) as prof:
        engine.generate(_prompts(tokenizer), sampling=SamplingConfig(max_new_tokens=8, seed=0))
    shapes = [tuple(e.input_shapes[0]) for e in prof.events()
              if e.name == "aten::_to_copy" and e.input_shapes]
    assert shapes, "the profile recorded no cast at all: the test can no longer see them"
    assert not [shape for shape in shapes if shape in weight_shapes]


def test_greedy_takes_the_argmax_and_left_padding_does_not_change_it(model, tokenizer):
    engine = _engine(model, tokenizer)
    greedy = SamplingConfig(max_new_tokens=4, temperature=0.0)
    batched = engine.generate(_prompts(tokenizer), sampling=greedy)
    alone = engine.generate([_prompts(tokenizer)[0]], sampling=greedy)
    assert batched[0].response_token_ids == alone[0].response_token_ids
    assert batched[0].log_probs == pytest.approx(alone[0].log_probs, abs=1e-5)
    prompt = torch.tensor([_prompts(tokenizer)[0]])
    with torch.no_grad():
        first = model(input_ids=prompt).logits[0, -1].argmax().item()
    assert alone[0].response_token_ids[0] == first


def test_top_k_restricts_sampling_and_zero_turns_it_off(model, tokenizer):
    engine = _engine(model, tokenizer)
    prompts = [_prompts(tokenizer)[0]] * 32
    # Near-uniform sampling (temperature 50): with top-k off, 32 x 3 draws over 100 ids
    # cannot all land in a fixed top-50 (HF's default k) except with probability 2^-96.
    free = engine.generate(prompts, sampling=SamplingConfig(max_new_tokens=3, temperature=50,
                                                            seed=0))
    restricted = engine.generate(prompts, sampling=SamplingConfig(
        max_new_tokens=3, temperature=50, top_k=3, seed=0))
    for samples, k, expect_outside in ((free, 50, True), (restricted, 3, False)):
        batch = RolloutBatch.from_samples(samples, answers=["0"] * 32, group_size=1,
                                          pad_token_id=tokenizer.pad_token_id)
        ids = torch.cat([batch.prompt_ids, batch.response_ids], dim=1)
        with torch.no_grad():
            logits = model(input_ids=ids).logits[:, batch.prompt_ids.shape[1] - 1:-1]
        top = logits.topk(k, dim=-1).indices
        inside = (top == batch.response_ids.unsqueeze(-1)).any(-1)
        assert bool((~inside).any()) is expect_outside


def test_eos_stops_a_response_and_is_reported(model, tokenizer):
    prompt = _prompts(tokenizer)[:1]
    probe = _engine(model, tokenizer).generate(
        prompt, sampling=SamplingConfig(max_new_tokens=1, temperature=0.0))
    # Declare the greedy first token to be EOS: generation must stop right after it.
    eos = probe[0].response_token_ids[0]
    engine = HFRolloutEngine(model, eos_token_id=eos, pad_token_id=tokenizer.pad_token_id)
    [sample] = engine.generate(prompt, sampling=SamplingConfig(max_new_tokens=8, temperature=0))
    assert sample.response_token_ids == (eos,)
    assert sample.finish_reason == "stop"


def test_update_weights_changes_generation_and_rejects_unknown_names(model, tokenizer):
    engine = _engine(model, tokenizer)
    greedy = SamplingConfig(max_new_tokens=6, temperature=0.0)
    other = build_tiny_causal_lm(TinyLMConfig(hidden_size=64, intermediate_size=128,
                                              attn_implementation="eager"),
                                 seed=1, tokenizer=tokenizer)
    engine.update_weights(other.state_dict().items())
    expected = _engine(other, tokenizer).generate(_prompts(tokenizer), sampling=greedy)
    assert engine.generate(_prompts(tokenizer), sampling=greedy) == expected
    with pytest.raises(RolloutError, match="unknown parameter"):
        engine.update_weights([("no.such.weight", torch.zeros(1))])
    name, tensor = next(iter(other.state_dict().items()))
    with pytest.raises(RolloutError, match="update is"):
        engine.update_weights([(name, tensor[:1])])


def test_discarding_offload_frees_weights_until_they_are_synced_back(model, tokenizer):
    engine = _engine(model, tokenizer)
    snapshot = {k: v.clone() for k, v in model.state_dict().items()}
    greedy = SamplingConfig(max_new_tokens=6, temperature=0.0)
    before = engine.generate(_prompts(tokenizer), sampling=greedy)
    engine.offload()
    assert all(p.untyped_storage().nbytes() == 0 for p in model.parameters())
    with pytest.raises(RolloutError, match="offloaded"):
        engine.generate(_prompts(tokenizer), sampling=greedy)
    engine.onload()
    assert engine.needs_weights
    with pytest.raises(RolloutError, match="sync weights"):
        engine.generate(_prompts(tokenizer), sampling=greedy)
    engine.update_weights(snapshot.items())
    assert not engine.needs_weights
    assert engine.generate(_prompts(tokenizer), sampling=greedy) == before


def test_host_offload_keeps_weights(model, tokenizer):
    engine = HFRolloutEngine(model, eos_token_id=tokenizer.eos_token_id,
                             pad_token_id=tokenizer.pad_token_id, offload_policy="host")
    greedy = SamplingConfig(max_new_tokens=4, temperature=0.0)
    before = engine.generate(_prompts(tokenizer), sampling=greedy)
    engine.offload()
    engine.onload()
    assert engine.generate(_prompts(tokenizer), sampling=greedy) == before


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_gpu_offload_moves_weights_to_host_and_back(model, tokenizer):
    engine = HFRolloutEngine(model, eos_token_id=tokenizer.eos_token_id,
                             pad_token_id=tokenizer.pad_token_id, device="cuda")
    greedy = SamplingConfig(max_new_tokens=4, temperature=0.0)
    before = engine.generate(_prompts(tokenizer), sampling=greedy)
    used = torch.cuda.memory_allocated()
    engine.offload()
    assert all(p.device.type == "cpu" for p in model.parameters())
    assert torch.cuda.memory_allocated() < used
    engine.onload()
    assert engine.generate(_prompts(tokenizer), sampling=greedy) == before


def test_a_stop_sequence_ends_a_response_after_it(model, tokenizer):
    engine = _engine(model, tokenizer)
    greedy = SamplingConfig(max_new_tokens=8, temperature=0.0)
    free = engine.generate(_prompts(tokenizer), sampling=greedy)
    # Each row's own tokens 2..3 as its stop: the row must end right after their first
    # occurrence, with the same tokens and log-probs as the unstopped response up to there.
    for row, sample in enumerate(free):
        tokens = sample.response_token_ids
        stop = tuple(tokens[2:4])
        end = next(i + len(stop) for i in range(len(tokens)) if tokens[i:i + len(stop)] == stop)
        stopped = engine.generate([_prompts(tokenizer)[row]],
                                  sampling=SamplingConfig(max_new_tokens=8, temperature=0.0,
                                                          stop_sequences=(stop,)))[0]
        assert stopped.response_token_ids == tokens[:end], row
        assert stopped.finish_reason == "stop_sequence"
        assert stopped.log_probs == pytest.approx(sample.log_probs[:end], abs=1e-5)


def test_rows_that_stop_early_leave_the_others_running(model, tokenizer):
    engine = _engine(model, tokenizer)
    greedy = SamplingConfig(max_new_tokens=8, temperature=0.0)
    free = engine.generate(_prompts(tokenizer), sampling=greedy)
    stop = (free[0].response_token_ids[0],)
    stopped = engine.generate(_prompts(tokenizer), sampling=SamplingConfig(
        max_new_tokens=8, temperature=0.0, stop_sequences=(stop,)))
    for before, after in zip(free, stopped, strict=True):
        tokens = before.response_token_ids
        end = tokens.index(stop[0]) + 1 if stop[0] in tokens else len(tokens)
        assert after.response_token_ids == tokens[:end]
    assert stopped[0].finish_reason == "stop_sequence"


def test_an_empty_stop_sequence_is_refused():
    with pytest.raises(ConfigError, match="stop sequence"):
        SamplingConfig(stop_sequences=((),))


@pytest.mark.parametrize("logits_budget_bytes", [1 << 30, 0])
def test_continuing_from_the_kept_cache_equals_generating_from_the_whole_context(
        model, tokenizer, logits_budget_bytes):
    """Rows of a kept call continue with appended tokens (different lengths, a row that
    stopped early): the same tokens and log-probs as a fresh call on the whole contexts,
    with the log-probs from the kept logits or recomputed over the padded contexts."""
    engine = HFRolloutEngine(model, eos_token_id=tokenizer.eos_token_id,
                             pad_token_id=tokenizer.pad_token_id,
                             logits_budget_bytes=logits_budget_bytes)
    greedy = SamplingConfig(max_new_tokens=6, temperature=0.0)
    prompts = _prompts(tokenizer)
    stop = (engine.generate(prompts, sampling=greedy)[1].response_token_ids[1],)
    first = engine.generate(prompts, sampling=SamplingConfig(
        max_new_tokens=6, temperature=0.0, stop_sequences=(stop,)), keep_cache=True)
    rows, extra = [2, 0], [tokenizer.encode("+1="), tokenizer.encode("5")]
    continued = engine.continue_generation(rows, extra, sampling=greedy)
    whole = [list(prompts[r]) + list(first[r].response_token_ids) + e
             for r, e in zip(rows, extra, strict=True)]
    fresh = engine.generate(whole, sampling=greedy)
    for a, b, context in zip(continued, fresh, whole, strict=True):
        assert a.response_token_ids == b.response_token_ids
        assert a.log_probs == pytest.approx(b.log_probs, abs=1e-5)
        assert list(a.prompt_token_ids) == context
    with pytest.raises(RolloutError, match="keep_cache"):  # used: gone
        engine.continue_generation([0], [[5]], sampling=greedy)
