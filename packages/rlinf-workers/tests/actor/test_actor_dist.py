"""Two-process data-parallel training (gloo on CPU): DDP and FSDP2, GRPO and PPO."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import pytest
import torch

HERE = Path(__file__).parent
sys.path.insert(0, str(HERE))
from dist_train import CONFIG, config, make_batch  # noqa: E402
from rank_launch import launch  # noqa: E402

from rlinf.workers.actor import PolicyTrainer  # noqa: E402
from rlinf.workers.models import build_char_tokenizer, build_tiny_causal_lm  # noqa: E402


def _launch(modes: list[str], out: Path) -> dict[str, list[dict[str, Any]]]:
    return launch(HERE / "dist_train.py", modes, out, timeout=240)


def _single_process_params(mode: str = "none") -> dict[str, torch.Tensor]:
    model = build_tiny_causal_lm(CONFIG, seed=0, tokenizer=build_char_tokenizer())
    actor = PolicyTrainer(model, config=config(mode))
    for _ in range(2):
        actor.train(make_batch())
    return {k: v.clone() for k, v in actor.model.state_dict().items()}


@pytest.fixture(scope="module")
def launched(tmp_path_factory: pytest.TempPathFactory) -> dict[str, list[dict[str, Any]]]:
    """Every mode in one launch of the two ranks (starting Python is the slow part)."""
    return _launch(["ddp", "fsdp2", "ddp-ppo"], tmp_path_factory.mktemp("dist"))


def test_ppo_on_two_ranks_equals_one_process_whitening_the_whole_batch(launched) -> None:
    # Advantages are whitened over the global batch (one all-reduce of the moments), so the
    # two ranks' shards train as the whole batch does in one process; whitening each shard
    # alone moved them by up to 0.04 from the one-process run after two steps here.
    ranks = [o["params"] for o in launched["ddp-ppo"]]
    reference = _single_process_params("none-ppo")
    for name in reference:
        torch.testing.assert_close(ranks[0][name], ranks[1][name], atol=0, rtol=0)
        torch.testing.assert_close(ranks[0][name], reference[name], atol=2e-5, rtol=1e-4,
                                   msg=lambda m, name=name: f"{name}: {m}")


def test_ddp_and_fsdp2_ranks_end_identical_and_equal_to_one_process_on_the_whole_batch(
        launched):
    results = {mode: launched[mode] for mode in ("ddp", "fsdp2")}
    reference = _single_process_params()
    initial = build_tiny_causal_lm(CONFIG, seed=0, tokenizer=build_char_tokenizer()).state_dict()
    assert any(not torch.equal(reference[n], initial[n]) for n in reference)
    for mode, outputs in results.items():
        ranks = [o["params"] for o in outputs]
        assert ranks[0].keys() == ranks[1].keys() == reference.keys(), mode
        for name in reference:
            torch.testing.assert_close(ranks[0][name], ranks[1][name], atol=0, rtol=0)
            # token-mean over shards of 11 and 12 tokens: every rank weighs its tokens by
            # all ranks' count, so the summed gradient is the whole batch's
            torch.testing.assert_close(ranks[0][name], reference[name], atol=2e-5, rtol=1e-4,
                                       msg=lambda m, mode=mode, name=name: f"{mode} {name}: {m}")
        for output in outputs:  # checkpoint/resume under DDP and FSDP2, on every rank
            for name, value in output["continued"].items():
                torch.testing.assert_close(output["resumed"][name], value, atol=1e-6,
                                           rtol=1e-5)
