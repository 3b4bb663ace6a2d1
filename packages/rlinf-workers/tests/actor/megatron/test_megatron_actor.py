"""The Megatron actor on two gloo ranks against one process training the Hugging Face model
(the DDP/none actor) on the same batch: tensor parallel (with and without sequence
parallelism), pipeline parallel (tied and untied output head), data parallel, GRPO and PPO
with its critic; log-probs, metrics, parameters after two steps, the critic's values,
resume."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import pytest
import torch

pytest.importorskip("megatron.core", reason="needs the megatron extra")

HERE = Path(__file__).parent
sys.path.insert(0, str(HERE.parent))
sys.path.insert(0, str(HERE))
from dist_train import config, make_batch  # noqa: E402
from megatron_train import algorithm, build_model, capture_gradients  # noqa: E402
from rank_launch import launch  # noqa: E402

from rlinf.workers.actor import PolicyTrainer  # noqa: E402
from rlinf.workers.models import response_log_probs  # noqa: E402

MODES = ["tp2-pp1", "tp1-pp2", "tp1-pp1", "tp2-pp1-untied", "tp1-pp2-untied", "tp2-pp1-sp",
         "tp1-pp1-dopt", "tp2-pp1-sp-ppo", "tp1-pp2-ppo", "tp1-pp1-dopt-ppo"]
"""The ``-ppo`` modes train PPO with the critic cut like the policy: tensor parallel with
sequence parallelism (the value head's gather), pipeline parallel (its own pass), and data
parallel with the distributed optimizer (whitening over the data-parallel group)."""


@pytest.fixture(scope="module")
def launched(tmp_path_factory: pytest.TempPathFactory) -> dict[str, list[dict[str, Any]]]:
    """Every mode in one launch of two ranks (starting Python and megatron is the slow part)."""
    return launch(HERE / "megatron_train.py", MODES, tmp_path_factory.mktemp("megatron"))


def _reference(tied: bool, mode: str = "") -> tuple[
        torch.Tensor, list[dict[str, float]], dict[str, torch.Tensor], dict[str, torch.Tensor],
        dict[str, torch.Tensor], torch.Tensor | None]:
    """One process, the Hugging Face model, trained with `mode`'s algorithm: log-probs,
    metrics, initial and trained params, the first step's (clipped) gradients, and with PPO
    the critic's values after training."""
    model = build_model(tied)
    batch = make_batch()
    initial = {k: v.clone() for k, v in model.state_dict().items()}
    with torch.no_grad():
        log_probs = response_log_probs(model, prompt_ids=batch.prompt_ids,
                                       prompt_mask=batch.prompt_mask,
                                       response_ids=batch.response_ids,
                                       response_mask=batch.response_mask)
    actor = PolicyTrainer(model, config=config(algorithm(mode)))
    grads = capture_gradients(actor)
    metrics = [actor.train(batch) for _ in range(2)]
    values = actor.response_values(batch) if actor.critic is not None else None
    return log_probs, metrics, initial, dict(actor.model.state_dict()), grads, values


@pytest.fixture(scope="module")
def launched_on_four(tmp_path_factory: pytest.TempPathFactory
                     ) -> dict[str, list[dict[str, Any]]]:
    """Tensor and pipeline parallelism together, on four ranks: the hidden states between
    stages are each rank's share of the sequence under sequence parallelism."""
    return launch(HERE / "megatron_train.py", FOUR_RANK_MODES,
                  tmp_path_factory.mktemp("megatron4"), world=4)


FOUR_RANK_MODES = ["tp2-pp2", "tp2-pp2-sp", "tp1-pp2-dopt"]


@pytest.mark.parametrize("mode", MODES)
def test_megatron_cut_trains_like_one_process(launched, mode: str) -> None:
    _check_trains_like_one_process(launched[mode], mode)


@pytest.mark.parametrize("mode", FOUR_RANK_MODES)
def test_tensor_and_pipeline_cut_trains_like_one_process(launched_on_four, mode: str) -> None:
    _check_trains_like_one_process(launched_on_four[mode], mode)
    expected = 2.0 if mode.endswith("-sp") else 1.0
    assert {r["sequence_split"] for r in launched_on_four[mode]} == {expected}


def _check_trains_like_one_process(ranks: list[dict[str, Any]], mode: str) -> None:
    tied = "untied" not in mode
    log_probs, metrics, initial, trained, grads, values = _reference(tied, mode)
    # The first step's gradients, gathered from every shard, are the one process's.
    gathered = ranks[0]["grads"]
    assert grads and set(gathered) >= set(grads)
    for name, grad in grads.items():
        torch.testing.assert_close(gathered[name], grad, rtol=1e-4, atol=1e-6, msg=name)
    for result in ranks:
        # Every rank sees the log-probs of the last stage, from its share of the vocabulary.
        assert torch.allclose(result["log_probs"], log_probs, atol=2e-6)
        for got, want in zip(result["metrics"], metrics, strict=True):
            assert set(got) == set(want)
            for key in want:
                assert got[key] == pytest.approx(want[key], rel=1e-4, abs=1e-6), key
        if values is None:
            assert result["values"] == []
        else:
            # The critic starts at zero (GAE begins as plain returns) and learns as the
            # one process's critic does.
            before, after = result["values"]
            assert not before.any()
            assert after.abs().max() > 1e-3
            torch.testing.assert_close(after, values, rtol=1e-4, atol=1e-6)
    rooted = [r["params"] for r in ranks if r["params"]]
    # The first rank of each model-parallel group (one per data-parallel replica) roots it.
    assert len(rooted) == ranks[0]["describe"]["data_parallel"]
    for params in rooted:
        assert set(params) == set(trained)
        # AdamW's first steps move each weight by about lr whatever its gradient's size, so
        # compare the updates, not the weights: within 1e-4 of the update's norm.
        error = sum(float(((params[k] - initial[k]) - (trained[k] - initial[k])).square().sum())
                    for k in trained)
        size = sum(float((trained[k] - initial[k]).square().sum()) for k in trained)
        assert (error / size) ** 0.5 < 1e-4


@pytest.mark.parametrize("mode", ["tp2-pp1", "tp1-pp2", "tp1-pp1-dopt", "tp1-pp2-ppo"])
def test_megatron_checkpoint_resumes_exactly(launched, mode: str) -> None:
    root = launched[mode][0]
    for name, tensor in root["continued"].items():
        assert torch.equal(tensor, root["resumed"][name]), name


@pytest.mark.parametrize("mode", ["tp2-pp1", "tp1-pp2", "tp1-pp2-untied", "tp2-pp1-sp",
                                  "tp1-pp1-dopt", "tp1-pp2-ppo"])
def test_another_cut_resumes_from_the_distributed_checkpoint(launched, mode: str) -> None:
    """TP=2 saved, PP=2 resumed (and back): megatron-core's distributed checkpoint reshards
    model and optimizer, so the next step lands where the saving cut's own next step did
    (to float rounding: within 1e-4 of that step's update)."""
    root = launched[mode][0]
    before, after, moved = root["params"], root["continued"], root["resharded"]
    assert set(moved) == set(after)
    error = sum(float((moved[k] - after[k]).square().sum()) for k in after)
    size = sum(float((after[k] - before[k]).square().sum()) for k in after)
    assert (error / size) ** 0.5 < 1e-4


@pytest.mark.parametrize("mode", ["tp2-pp1", "tp1-pp2-untied"])
def test_megatron_checkpoint_reassembles_into_hugging_face_names(launched, mode: str) -> None:
    root = launched[mode][0]
    assert set(root["exported"]) == set(root["params"])
    for name, tensor in root["params"].items():
        assert torch.equal(root["exported"][name], tensor), name


@pytest.mark.gpu
def test_megatron_actor_on_a_gpu_trains_like_one_cpu_process(tmp_path: Path) -> None:
    """One rank on CUDA (NCCL; TP=1 and PP=1 still run the whole path: stage input, 1F1B,
    vocabulary-local log-probs, the gather for the rollout, both checkpoints)."""
    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA GPU")
    result = launch(HERE / "megatron_train.py", ["tp1-pp1"], tmp_path, world=1,
                    env={"RLINF_MEGATRON_DEVICE": "cuda"})["tp1-pp1"][0]
    log_probs, _, initial, trained, _, _ = _reference(tied=True)
    assert torch.allclose(result["log_probs"], log_probs, atol=1e-4)
    error = sum(float(((result["params"][k].cpu() - initial[k]) - (trained[k] - initial[k]))
                      .square().sum()) for k in trained)
    size = sum(float((trained[k] - initial[k]).square().sum()) for k in trained)
    assert (error / size) ** 0.5 < 1e-2  # TF32 and CUDA kernels against CPU fp32


def test_sequence_parallelism_splits_the_sequence_between_layers(launched) -> None:
    """The equivalence above holds with the norms seeing half the sequence each."""
    assert {r["sequence_split"] for r in launched["tp2-pp1-sp"]} == {2.0}
    assert {r["sequence_split"] for r in launched["tp2-pp1"]} == {1.0}
    assert {r["describe"]["sequence_parallel"] for r in launched["tp2-pp1-sp"]} == {True}


def test_the_distributed_optimizer_splits_adams_state_over_data_parallel_ranks(
        launched) -> None:
    """Two moments per parameter: the two ranks hold one copy between them (half each, to
    the padding of the last range), where plain AdamW holds one on each."""
    parameters = launched["tp1-pp1"][0]["describe"]["stage_parameters"]
    held = [r["describe"]["optimizer_state_elements"] for r in launched["tp1-pp1-dopt"]]
    assert sum(held) == 2 * parameters
    assert max(held) - min(held) <= 2
    assert {r["describe"]["optimizer_state_elements"] for r in launched["tp1-pp1"]} == {
        2 * parameters}


def test_each_rank_describes_its_cut(launched) -> None:
    stages = sorted(r["describe"]["pipeline_stage"] for r in launched["tp1-pp2"])
    assert stages == [0, 1]
    ranks = sorted(r["describe"]["tensor_rank"] for r in launched["tp2-pp1"])
    assert ranks == [0, 1]
    assert {r["describe"]["data_parallel"] for r in launched["tp1-pp1"]} == {2}
