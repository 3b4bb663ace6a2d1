"""The adapters-only weight sync of a LoRA actor: the rollout (HF engine) and the inference
role receive the adapters, merge them into their plain models, and then score exactly as
the trainer does, while the sync moves a small share of the model's bytes."""

from __future__ import annotations

import dataclasses
import os

import pytest
from rlinf_reasoning.flow import ReasoningFlow
from rlinf_reasoning.warmstart import load_warmstart, warmstart_task
from rlinf_reasoning.workflow import fixed_plan

from rlinf.envs.math import MathProblem, ProblemGenerator
from rlinf.workers.actor import LoraConfig
from rlinf.workers.reasoning import ProblemBatches

from .test_flow import SPEC as FLOW_SPEC

pytest.importorskip("peft", reason="the lora extra")
os.environ.setdefault("RAY_AUTH_MODE", "disabled")
os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")

SPEC = dataclasses.replace(
    FLOW_SPEC, actor=dataclasses.replace(FLOW_SPEC.actor, lr=2e-2, lora=LoraConfig(rank=4)))
"""test_flow's spec (sync check on) with rank-4 adapters on its actor."""


def _problems() -> list[list[MathProblem]]:
    stream = ProblemGenerator(warmstart_task()).stream(split="train")
    return [[next(stream) for _ in range(4)] for _ in range(3)]


def _model_bytes() -> int:
    model, _ = load_warmstart()
    return sum(p.numel() * p.element_size() for p in model.parameters())


@pytest.mark.parametrize("placement,devices,transport", [
    ("rollout,reward,inference,actor: 0", 1, "inprocess"),
    ("rollout: 0, reward,inference,actor: 1", 2, "shm"),
])
def test_adapters_only_sync_keeps_every_receiver_exact_and_moves_few_bytes(
        ray_local: None, placement: str, devices: int, transport: str) -> None:
    assert SPEC.lora_sync_adapters
    with ReasoningFlow.launch(SPEC, fixed_plan(SPEC, placement, num_devices=devices),
                              problems=ProblemBatches(_problems())) as flow:
        assert transport in flow.transport
        for step in range(3):
            metrics = flow.step(step).metrics
            assert metrics["actor/grad_norm"] > 0  # the adapters train and move
            # After each sync the rollout's and the inference role's log-probs are the
            # trainer's: the merged adapters are the trained ones.
            assert metrics["weight_sync/logprob_max_abs_diff"] < 1e-4
            assert metrics["weight_sync/inference_logprob_max_abs_diff"] < 1e-4
            assert metrics["weight_sync/bytes"] < 0.10 * _model_bytes()


def test_a_receiver_that_discards_its_weights_gets_the_merged_model(ray_local: None) -> None:
    """The control: an HF engine that discards its weights on offload cannot merge into
    them, so the flow syncs merged weights, and the measure sees the whole model."""
    spec = dataclasses.replace(SPEC, engine_options={"offload_policy": "discard"})
    assert not spec.lora_sync_adapters
    with ReasoningFlow.launch(spec, fixed_plan(spec, "rollout: 0, reward,inference,actor: 1",
                                               num_devices=2),
                              problems=ProblemBatches(_problems())) as flow:
        metrics = flow.step(0).metrics
    assert metrics["weight_sync/logprob_max_abs_diff"] < 1e-4
    assert metrics["weight_sync/bytes"] >= 0.9 * _model_bytes()
