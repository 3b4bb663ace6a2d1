"""LoRA on the actor's policy: only the adapters train and have optimizer state, the merged
weights the generators receive are PEFT's own merge, and an adapters-only sync rebuilds
them on a plain model from a fraction of the bytes."""

from __future__ import annotations

import copy
import sys
from pathlib import Path

import pytest
import torch

sys.path.insert(0, str(Path(__file__).parent))
from dist_train import CONFIG, make_batch

pytest.importorskip("peft", reason="the lora extra")

from rlinf.workers.actor import ActorConfig, LoraConfig, LoraMerger, PolicyTrainer
from rlinf.workers.actor.lora import (
    adapter_named_tensors,
    merged_named_tensors,
    trainable_parameter_count,
)
from rlinf.workers.errors import ConfigError
from rlinf.workers.models import build_char_tokenizer, build_tiny_causal_lm

LORA = LoraConfig(rank=4, alpha=8.0, target_modules=("q_proj", "v_proj"))


def _model() -> torch.nn.Module:
    return build_tiny_causal_lm(CONFIG, seed=0, tokenizer=build_char_tokenizer())


def _actor(lora: LoraConfig = LORA, **options: object) -> PolicyTrainer:
    config = ActorConfig(lr=5e-2, parallelism="none", micro_batch_size=4, lora=lora,
                         **options)  # type: ignore[arg-type]
    return PolicyTrainer(_model(), config=config)


def _trained(actor: PolicyTrainer) -> dict[str, float]:
    rewards = torch.zeros(8)
    rewards[2] = 1.0
    return actor.train(make_batch().replace(rewards=rewards))


def test_only_the_adapters_train_and_have_optimizer_state() -> None:
    actor = _actor()
    hidden, layers = CONFIG.hidden_size, CONFIG.num_layers
    kv = CONFIG.num_kv_heads * (hidden // CONFIG.num_heads)
    by_hand = layers * (4 * (hidden + hidden) + 4 * (hidden + kv))  # r x (in + out) per layer
    assert trainable_parameter_count(actor.model) == by_hand
    base = {n: p.detach().clone() for n, p in actor.model.named_parameters()
            if not p.requires_grad}
    _trained(actor)
    state = actor.optimizer.state
    trained = [p for p in actor.model.parameters() if p.requires_grad]
    assert set(map(id, state)) == set(map(id, trained))
    assert sum(p.numel() for p in trained) == by_hand
    for name, param in actor.model.named_parameters():
        if name in base:
            assert torch.equal(param, base[name]), name  # the base weights never move
    assert any(p.abs().sum() > 0 for n, p in actor.model.named_parameters()
               if "lora_B" in n)  # B starts at 0: the step moved it


def test_the_generators_get_peft_s_own_merge_under_the_base_names() -> None:
    actor = _actor()
    _trained(actor)
    merged = dict(merged_named_tensors(actor.model))
    reference = copy.deepcopy(actor.model).merge_and_unload().state_dict()
    assert merged.keys() == reference.keys() == _model().state_dict().keys()
    for name, tensor in reference.items():
        torch.testing.assert_close(merged[name], tensor, rtol=1e-5, atol=1e-6, msg=name)
    synced = dict(kv for bucket in actor.state_dict_for_rollout() for kv in bucket)
    assert synced.keys() == merged.keys()
    assert any("lora_A" in n for n in actor.model.state_dict())  # the trainer stays unmerged


def test_an_adapters_only_sync_rebuilds_the_merge_from_a_tenth_of_the_bytes() -> None:
    actor = _actor(LoraConfig(rank=2, alpha=4.0, target_modules=("q_proj", "v_proj")))
    _trained(actor)
    adapters = dict(adapter_named_tensors(actor.model))
    full = dict(merged_named_tensors(actor.model))
    sent = sum(t.numel() * t.element_size() for t in adapters.values())
    whole = sum(t.numel() * t.element_size() for t in full.values())
    assert sent < 0.10 * whole, (sent, whole)
    generator = _model()
    merger = LoraMerger(generator, LoraConfig(rank=2, alpha=4.0,
                                              target_modules=("q_proj", "v_proj")))
    assert merger.load(adapters) == 2 * CONFIG.num_layers
    for name, tensor in generator.state_dict().items():
        torch.testing.assert_close(tensor, full[name], rtol=1e-5, atol=1e-6, msg=name)


def test_bad_lora_settings_say_what_is_wrong() -> None:
    with pytest.raises(ConfigError, match=r"name no linear layer.*its linear layers are"):
        _actor(LoraConfig(target_modules=("query",)))
    with pytest.raises(ConfigError, match="'ddp' or 'none', not 'fsdp2'"):
        ActorConfig(parallelism="fsdp2", lora=LORA)
    with pytest.raises(ConfigError, match="rank must be >= 1"):
        LoraConfig(rank=0)
