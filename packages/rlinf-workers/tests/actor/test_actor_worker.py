from __future__ import annotations

import dataclasses
import math
import sys
from pathlib import Path

import pytest
import torch

sys.path.insert(0, str(Path(__file__).parent))
from dist_train import CONFIG, make_batch

from rlinf.workers.actor import ActorConfig, PolicyTrainer
from rlinf.workers.errors import ConfigError
from rlinf.workers.models import (
    build_char_tokenizer,
    build_tiny_causal_lm,
    response_log_probs,
)
from rlinf.workers.models.packing import pack_rows
from rlinf.workers.rollout import RolloutBatch, RolloutSample


def _model():
    return build_tiny_causal_lm(CONFIG, seed=0, tokenizer=build_char_tokenizer())


def _seq_log_probs(model, batch) -> torch.Tensor:
    with torch.no_grad():
        return response_log_probs(
            model, prompt_ids=batch.prompt_ids, prompt_mask=batch.prompt_mask,
            response_ids=batch.response_ids, response_mask=batch.response_mask).sum(-1)


def _params(actor: PolicyTrainer) -> dict[str, torch.Tensor]:
    return {k: v.detach().clone() for k, v in actor.model.state_dict().items()}


@pytest.mark.parametrize("algorithm", ["grpo", "ppo"])
def test_a_step_raises_the_log_prob_of_the_rewarded_sample(algorithm):
    batch = make_batch()
    rewards = torch.zeros(8)
    rewards[2] = 1.0  # one rewarded sample, in the first group
    batch = batch.replace(rewards=rewards)
    model = _model()
    before = _seq_log_probs(model, batch)
    actor = PolicyTrainer(model, config=ActorConfig(algorithm=algorithm, lr=5e-3,
                                                  parallelism="none", micro_batch_size=3))
    metrics = actor.train(batch)
    delta = _seq_log_probs(actor.model, batch) - before
    assert delta[2] > 0
    assert delta[2] > delta[:4][torch.arange(4) != 2].max()
    assert actor.global_step == 1
    assert metrics["grad_norm"] > 0
    if algorithm == "ppo":
        assert metrics["value_loss"] > 0


def _train_recording_gradient(actor: PolicyTrainer, batch) -> dict[str, torch.Tensor]:
    """Train one step; returns the accumulated gradient the optimizer stepped with."""
    seen: dict[str, torch.Tensor] = {}
    step = actor.optimizer.step

    def recording_step(*args, **kwargs):
        seen.update({n: p.grad.clone() for n, p in actor.model.named_parameters()
                     if p.grad is not None})
        return step(*args, **kwargs)

    actor.optimizer.step = recording_step  # type: ignore[method-assign]
    actor.train(batch)
    return seen


@pytest.mark.parametrize("aggregation",
                         ["token-mean", "seq-mean-token-sum", "seq-mean-token-mean"])
def test_micro_batch_accumulation_equals_one_big_batch(aggregation):
    # Micro-batches of 1, 3 and 8 rows (grouped by response length, padding cut) accumulate
    # the gradient of the whole batch's aggregated loss.
    batch = make_batch()
    grads, params = [], []
    for micro in (1, 3, 8):
        actor = PolicyTrainer(_model(), config=ActorConfig(
            lr=1e-2, parallelism="none", micro_batch_size=micro, aggregation=aggregation,
            max_grad_norm=None))
        grads.append(_train_recording_gradient(actor, batch))
        params.append(_params(actor))
    assert set(grads[0]) == set(grads[1]) == set(grads[2]) and grads[0]
    scale = max(float(g.abs().max()) for g in grads[0].values())
    for name in grads[0]:
        # Float rounding of differently ordered sums: ~1e-7 of gradients up to ~0.2.
        for other in (grads[1], grads[2]):
            torch.testing.assert_close(other[name], grads[0][name], atol=1e-6 * max(scale, 1),
                                       rtol=1e-5)
    for name in params[0]:
        # Adam divides by |g|: a rounding difference in a near-zero gradient moves that
        # parameter by up to ~1e-4, while a real mismatch would be ~lr = 1e-2.
        for other in (params[1], params[2]):
            torch.testing.assert_close(other[name], params[0][name], atol=2e-4, rtol=1e-4)


@pytest.mark.parametrize("algorithm", ["grpo", "ppo"])
def test_padding_free_training_steps_with_the_padded_gradient(algorithm):
    # Responses of 1-12 tokens behind prompts of 3-4: packed, the 8 rows fit in fewer
    # positions, and the step is the padded one's up to float rounding.
    gen = torch.Generator().manual_seed(1)
    samples = [RolloutSample(
        prompt_token_ids=tuple(torch.randint(4, 90, (3 + row % 2,), generator=gen).tolist()),
        response_token_ids=tuple(torch.randint(4, 90, (length,), generator=gen).tolist()),
        log_probs=(-4.0,) * length, finish_reason="length")
        for row, length in enumerate((12, 1, 3, 7, 2, 12, 5, 1))]
    batch = RolloutBatch.from_samples(samples, answers=["0"] * 8, group_size=4,
                                      pad_token_id=0).replace(rewards=torch.tensor(
                                          [1.0, 0, 0, 0, 0, 1, 0, 0]))
    assert pack_rows(batch.prompt_ids, batch.prompt_mask, batch.response_ids,
                     batch.response_mask) is not None
    grads, params = [], []
    for padding_free in (False, True):
        actor = PolicyTrainer(_model(), config=ActorConfig(
            algorithm=algorithm, lr=1e-2, parallelism="none", micro_batch_size=8,
            max_grad_norm=None, padding_free=padding_free))
        grads.append(_train_recording_gradient(actor, batch))
        params.append(_params(actor))
    assert set(grads[0]) == set(grads[1]) and grads[0]
    scale = max(float(g.abs().max()) for g in grads[0].values())
    for name in grads[0]:
        torch.testing.assert_close(grads[1][name], grads[0][name], atol=1e-6 * max(scale, 1),
                                   rtol=1e-5)
    for name in params[0]:
        torch.testing.assert_close(params[1][name], params[0][name], atol=2e-4, rtol=1e-4)


@pytest.mark.parametrize("algorithm", ["grpo", "ppo"])
def test_bf16_autocast_trains_fp32_weights_with_gradients_close_to_fp32(algorithm):
    batch = make_batch()
    grads, dtypes = {}, {}
    for precision in ("fp32", "bf16"):
        actor = PolicyTrainer(_model(), config=ActorConfig(
            algorithm=algorithm, lr=1e-2, parallelism="none", micro_batch_size=3,
            max_grad_norm=None, precision=precision))
        grads[precision] = _train_recording_gradient(actor, batch)
        dtypes[precision] = {p.dtype for p in actor.model.parameters()}
        dtypes[precision] |= {v.dtype for state in actor.optimizer.state.values()
                              for v in state.values() if v.ndim > 0}
    assert dtypes["bf16"] == dtypes["fp32"] == {torch.float32}
    flat = {k: torch.cat([g.flatten() for g in v.values()]) for k, v in grads.items()}
    # bf16 keeps 8 mantissa bits: the gradient is the same direction, not the same bits.
    cosine = torch.nn.functional.cosine_similarity(flat["bf16"], flat["fp32"], dim=0)
    assert cosine > 0.99
    assert not torch.equal(flat["bf16"], flat["fp32"])  # the matmuls really ran in bf16


@pytest.mark.parametrize("algorithm", ["grpo", "ppo"])
def test_auto_attention_trains_short_bf16_batches_with_eager_attention(algorithm):
    """`ActorConfig.attention`: "auto" differentiates eager attention (bf16, CPU, short
    rows), "model" the model's own; the same gradient up to bf16 noise, the model's kernel
    back in place after the step."""
    batch = make_batch()
    grads, kernels = {}, {}
    for choice in ("auto", "model"):
        model = build_tiny_causal_lm(dataclasses.replace(CONFIG, attn_implementation="sdpa"),
                                     seed=0, tokenizer=build_char_tokenizer())
        actor = PolicyTrainer(model, config=ActorConfig(
            algorithm=algorithm, lr=1e-2, parallelism="none", micro_batch_size=3,
            max_grad_norm=None, precision="bf16", attention=choice))
        seen: set[str] = set()
        for module in actor.model.modules():
            if type(module).__name__ == "Qwen2Attention":
                module.register_forward_hook(
                    lambda mod, args, out, seen=seen: seen.add(mod.config._attn_implementation))
        grads[choice] = _train_recording_gradient(actor, batch)
        kernels[choice] = seen
        assert model.config._attn_implementation == "sdpa"
    assert kernels == {"auto": {"eager"}, "model": {"sdpa"}}
    flat = {k: torch.cat([g.flatten() for g in v.values()]) for k, v in grads.items()}
    cosine = torch.nn.functional.cosine_similarity(flat["auto"], flat["model"], dim=0)
    assert cosine > 0.99


def test_an_unknown_attention_kernel_is_refused():
    with pytest.raises(ConfigError, match="attention must be one of"):
        ActorConfig(attention="flash")  # type: ignore[arg-type]


def test_micro_batches_group_similar_lengths_and_cut_padding():
    batch = make_batch()
    actor = PolicyTrainer(_model(), config=ActorConfig(parallelism="none", micro_batch_size=3))
    data = actor._prepare(batch)
    lengths = batch.response_mask.sum(-1)
    micros = actor._micro_batches(data, torch.arange(batch.num_rows))
    assert [len(m["response_mask"]) for m in micros] == [3, 3, 2]
    widths = [m["response_mask"].shape[1] for m in micros]
    # Longest responses first, each micro-batch only as wide as its longest row.
    seen = torch.cat([m["response_mask"].sum(-1) for m in micros])
    assert seen.tolist() == sorted(lengths.tolist(), reverse=True)
    assert widths == [int(m["response_mask"].sum(-1).max()) for m in micros] == [4, 3, 2]
    for m in micros:
        assert m["prompt_mask"][:, 0].any()  # no all-padding leading prompt column
        assert m["advantages"].shape == m["old_log_probs"].shape == m["response_ids"].shape


def test_ppo_critic_fits_the_returns_over_steps():
    batch = make_batch()
    actor = PolicyTrainer(_model(), config=ActorConfig(
        algorithm="ppo", lr=3e-3, parallelism="none", micro_batch_size=4, value_clip=None))
    losses = [actor.train(batch)["value_loss"] for _ in range(4)]
    assert losses[-1] < losses[0]


def test_mini_batches_and_epochs_count_optimizer_steps():
    actor = PolicyTrainer(_model(), config=ActorConfig(
        parallelism="none", mini_batch_size=4, epochs=2, micro_batch_size=2))
    actor.train(make_batch())
    assert actor.global_step == 4


def test_kl_term_needs_reference_and_is_zero_against_itself():
    batch = make_batch()
    config = ActorConfig(parallelism="none", kl_coef=0.1)
    actor = PolicyTrainer(_model(), config=config)
    with pytest.raises(ConfigError, match="ref_log_probs"):
        actor.train(batch)
    with torch.no_grad():
        ref = response_log_probs(
            actor.model, prompt_ids=batch.prompt_ids, prompt_mask=batch.prompt_mask,
            response_ids=batch.response_ids, response_mask=batch.response_mask)
    metrics = actor.train(batch.replace(ref_log_probs=ref))
    assert metrics["kl"] == pytest.approx(0.0, abs=1e-6)
    with pytest.raises(ConfigError, match="rewards"):
        actor.train(batch.replace(rewards=None))


def test_rollout_correction_weighs_each_token_by_the_capped_engine_mismatch():
    batch = make_batch()
    with torch.no_grad():  # on-policy: the trainer's old log-probs are its current ones
        old = response_log_probs(
            _model(), prompt_ids=batch.prompt_ids, prompt_mask=batch.prompt_mask,
            response_ids=batch.response_ids, response_mask=batch.response_mask)
    capped = ActorConfig(parallelism="none", max_grad_norm=None, rollout_correction_cap=2.0)
    # several optimizer steps per batch: pi_old must be recomputed before the first
    for steps in ({"epochs": 2}, {"mini_batch_size": 4}):
        several = dataclasses.replace(capped, **steps)  # type: ignore[arg-type]
        with pytest.raises(ConfigError, match="recompute"):
            PolicyTrainer(_model(), config=several).train(batch)
    plain = _train_recording_gradient(
        PolicyTrainer(_model(), config=ActorConfig(parallelism="none", max_grad_norm=None)),
        batch.replace(old_log_probs=old))
    # the engine agrees with the trainer: every weight is 1, nothing changes
    agreeing = _train_recording_gradient(PolicyTrainer(_model(), config=capped),
                                         batch.replace(old_log_probs=old,
                                                       rollout_log_probs=old.clone()))
    # the engine under-sampled every token 3x: each weight is capped at 2, the loss doubles
    under = _train_recording_gradient(PolicyTrainer(_model(), config=capped),
                                      batch.replace(old_log_probs=old,
                                                    rollout_log_probs=old - math.log(3.0)))
    # one step per batch: without a recompute, pi_old is the training forward's own
    fused_agreeing = _train_recording_gradient(PolicyTrainer(_model(), config=capped),
                                               batch.replace(rollout_log_probs=old.clone()))
    fused_under = _train_recording_gradient(PolicyTrainer(_model(), config=capped),
                                            batch.replace(rollout_log_probs=old - math.log(3.0)))
    assert plain
    for name, grad in plain.items():
        torch.testing.assert_close(agreeing[name], grad, rtol=1e-5, atol=1e-7)
        torch.testing.assert_close(under[name], 2 * grad, rtol=1e-5, atol=1e-7)
        torch.testing.assert_close(fused_agreeing[name], grad, rtol=1e-5, atol=1e-7)
        torch.testing.assert_close(fused_under[name], 2 * grad, rtol=1e-5, atol=1e-7)
    with pytest.raises(ConfigError, match="rollout_correction_cap"):
        ActorConfig(rollout_correction_cap=0.0)


def test_rollout_buckets_cover_the_state_dict_within_the_size_bound():
    actor = PolicyTrainer(_model(), config=ActorConfig(parallelism="none"))
    state = actor.model.state_dict()
    bound = 40_000
    buckets = list(actor.state_dict_for_rollout(bucket_bytes=bound))
    assert len(buckets) > 1
    names = [n for bucket in buckets for n, _ in bucket]
    assert names == list(state)
    for bucket in buckets:
        size = sum(t.numel() * t.element_size() for _, t in bucket)
        assert size <= bound or len(bucket) == 1
    for bucket in buckets:
        for name, tensor in bucket:
            assert torch.equal(tensor, state[name])


@pytest.mark.parametrize("algorithm", ["grpo", "ppo"])
def test_checkpoint_resume_continues_exactly(tmp_path, algorithm):
    batch = make_batch()
    config = ActorConfig(algorithm=algorithm, lr=1e-2, parallelism="none")
    actor = PolicyTrainer(_model(), config=config)
    actor.train(batch)
    actor.save_checkpoint(str(tmp_path))
    expected_noise = torch.rand(3)
    actor.train(batch)
    expected = _params(actor)

    other = build_tiny_causal_lm(CONFIG, seed=123, tokenizer=build_char_tokenizer())
    resumed = PolicyTrainer(other, config=config)
    torch.rand(5)  # disturb the RNG: loading must restore it
    resumed.load_checkpoint(str(tmp_path))
    assert resumed.global_step == 1
    assert torch.equal(torch.rand(3), expected_noise)
    resumed.train(batch)
    for name, value in _params(resumed).items():
        torch.testing.assert_close(value, expected[name], atol=1e-6, rtol=1e-5)
    with pytest.raises(ConfigError, match="no checkpoint"):
        resumed.load_checkpoint(str(tmp_path / "missing"))


def test_cpu_offload_keeps_training_state():
    batch = make_batch()
    actor = PolicyTrainer(_model(), config=ActorConfig(parallelism="none"))
    actor.train(batch)
    before = _params(actor)
    actor.offload()
    actor.onload()
    assert all(torch.equal(v, before[k]) for k, v in _params(actor).items())
    actor.train(batch)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_gpu_offload_moves_params_and_optimizer_state_to_host_and_back():
    batch = make_batch()
    actor = PolicyTrainer(_model(), config=ActorConfig(parallelism="none"), device="cuda")
    actor.train(batch)
    used = torch.cuda.memory_allocated()
    actor.offload()
    assert all(p.device.type == "cpu" for p in actor.model.parameters())
    assert all(v.device.type == "cpu" for s in actor.optimizer.state.values()
               for v in s.values() if isinstance(v, torch.Tensor) and v.ndim > 0)
    assert torch.cuda.memory_allocated() < used
    actor.onload()
    assert all(p.is_cuda for p in actor.model.parameters())
    actor.train(batch)


def test_config_validation():
    with pytest.raises(ConfigError):
        ActorConfig(algorithm="dpo")  # type: ignore[arg-type]
    with pytest.raises(ConfigError):
        ActorConfig(aggregation="sum")
    with pytest.raises(ConfigError):
        ActorConfig(micro_batch_size=0)
    with pytest.raises(ConfigError, match="precision"):
        ActorConfig(precision="fp16")  # type: ignore[arg-type]


def test_a_rank_the_checkpoint_has_no_file_for_reads_a_replicas(tmp_path, monkeypatch):
    """A relaunch on more data-parallel ranks than saved (auto's re-plan going back to a
    plan with more actor devices) restores rank 0's complete state on the new ranks."""
    from rlinf.workers.actor import checkpoint as ckpt

    trained = PolicyTrainer(_model(), config=ActorConfig(lr=5e-3, parallelism="none",
                                                       micro_batch_size=4))
    rewards = torch.zeros(8)
    rewards[2] = 1.0
    trained.train(make_batch().replace(rewards=rewards))
    trained.save_checkpoint(str(tmp_path))
    assert [p.name for p in tmp_path.glob("rank*.pt")] == ["rank0.pt"]
    monkeypatch.setattr(ckpt, "_rank", lambda: 1)  # as rank 1 of a larger group
    with pytest.raises(ConfigError, match="no checkpoint for rank 1"):
        ckpt.read_rank_file(tmp_path)
    fresh = PolicyTrainer(_model(), config=ActorConfig(lr=5e-3, parallelism="none",
                                                     micro_batch_size=4))
    fresh.load_checkpoint(str(tmp_path))
    assert fresh.global_step == trained.global_step == 1
    for name, tensor in trained.model.state_dict().items():
        assert torch.equal(fresh.model.state_dict()[name], tensor), name
