"""A Hugging Face VLM from a local folder as the VLA: decoding, scoring, PPO, weight sync."""

from pathlib import Path

import numpy as np
import pytest
import torch

from rlinf.comm import Batch
from rlinf.workers.embodied import EmbodiedActorConfig, EmbodiedActorWorker
from rlinf.workers.embodied.pretrained_vla import PretrainedVLA, PretrainedVLAConfig
from rlinf.workers.embodied.profiling import synthetic_trajectory
from rlinf.workers.embodied.vla_policy import VLAPolicyConfig, VLARolloutConfig, VLARolloutWorker
from rlinf.workers.errors import ConfigError, ShapeError
from rlinf.workers.models.tiny_vlm import save_tiny_vlm

from .conftest import CONTEXT

# Two stacked cameras (6 channels), as LIBERO's agent view + wrist frames reach the policy.
IMAGE_SHAPE = (6, 16, 16)


@pytest.fixture(scope="module")
def folder(tmp_path_factory: pytest.TempPathFactory) -> str:
    return save_tiny_vlm(tmp_path_factory.mktemp("tiny-vlm"), image_size=16, seed=0)


def network(folder: str, **overrides: object) -> PretrainedVLAConfig:
    fields: dict = {"path": folder, "image_shape": IMAGE_SHAPE, "action_dim": 3, "num_bins": 16}
    return PretrainedVLAConfig(**{**fields, **overrides})


def frames(count: int, seed: int = 0) -> torch.Tensor:
    rng = np.random.default_rng(seed)
    return torch.from_numpy(rng.integers(0, 256, (count, *IMAGE_SHAPE), dtype=np.uint8))


def test_action_tokens_are_the_last_ids_of_the_base_vocabulary(folder):
    vla = PretrainedVLA(network(folder, num_bins=50), seed=0)
    vocab = vla.tokenizer.vocab_size
    assert vla.bin_ids[0] == vocab - 1 and vla.bin_ids[-1] == vocab - vla.config.num_bins
    # OpenVLA's tokenizer with 255 bins: centres of linspace(-1, 1, 256) edges, digitize - 1.
    edges = np.linspace(-1, 1, 256)
    centres = (edges[:-1] + edges[1:]) / 2
    openvla = PretrainedVLA.__new__(PretrainedVLA)
    torch.nn.Module.__init__(openvla)
    openvla.config = network(folder, num_bins=255)
    np.testing.assert_allclose(openvla.tokens_to_action(torch.arange(255)).numpy(), centres,
                               atol=1e-6)
    values = torch.linspace(-0.999, 0.999, 101)
    expected = np.clip(np.digitize(values.numpy(), edges) - 1, 0, 254)
    np.testing.assert_array_equal(openvla.action_to_tokens(values).numpy(), expected)


def test_sampled_tokens_score_the_same_in_one_teacher_forced_pass(folder):
    vla = PretrainedVLA(network(folder), seed=0).eval()
    images, texts = frames(4), ["pick up the bowl"] * 4
    sample = vla.act(images, texts, generator=torch.Generator().manual_seed(0))
    assert sample.tokens.shape == (4, 3) and (sample.tokens < 16).all()
    assert (sample.action.abs() < 1).all()
    log_prob, entropy, value = vla.evaluate(images, texts, sample.tokens)
    torch.testing.assert_close(log_prob, sample.log_prob, atol=1e-4, rtol=1e-4)
    torch.testing.assert_close(value, sample.value, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(vla.value(images, texts), sample.value, atol=1e-5, rtol=1e-5)
    assert (entropy > 0).all() and (entropy <= 3 * np.log(16) + 1e-4).all()
    greedy = vla.act(images, texts, deterministic=True)
    assert torch.equal(greedy.tokens, vla.act(images, texts, deterministic=True).tokens)


def test_the_chosen_camera_is_what_the_model_sees(folder):
    vla = PretrainedVLA(network(folder, camera=1), seed=0).eval()
    images = frames(2)
    wrist_changed = images.clone()
    wrist_changed[:, 3:] = 255 - wrist_changed[:, 3:]
    agent_changed = images.clone()
    agent_changed[:, :3] = 255 - agent_changed[:, :3]
    texts = ["open the drawer"] * 2
    base = vla.value(images, texts)
    assert not torch.allclose(vla.value(wrist_changed, texts), base)
    torch.testing.assert_close(vla.value(agent_changed, texts), base)


def test_rollout_worker_and_ppo_actor_train_and_sync_the_checkpoint(folder):
    policy = VLAPolicyConfig(vla=network(folder), action_low=(-1.0, -2.0, 0.0),
                             action_high=(1.0, 2.0, 1.0), instruction="stack the blocks")
    worker = VLARolloutWorker(CONTEXT, config=VLARolloutConfig(policy=policy, seed=1))
    obs = frames(3).numpy()
    reply = worker.infer(Batch({"obs": obs, "final_obs": obs, "final_mask": np.zeros(3, bool),
                                "env_index": np.arange(3)})).tensors
    assert reply["action"].shape == (3, 3)
    assert (reply["action"][:, 1] >= -2).all() and (reply["action"][:, 1] <= 2).all()
    evaluated = worker.model.evaluate(torch.from_numpy(obs), torch.from_numpy(reply["action"]))
    np.testing.assert_allclose(evaluated.log_prob.detach().numpy(), reply["log_prob"],
                               atol=1e-4)

    actor = EmbodiedActorWorker(CONTEXT, config=EmbodiedActorConfig(
        policy=policy, epochs=1, num_minibatches=2, lr=1e-3))
    before = {k: v.clone() for k, v in actor.get_weights().items()}
    stats = actor.train(synthetic_trajectory(frames(2).numpy(), (3,), steps=3))
    assert np.isfinite(stats["policy_loss"]) and np.isfinite(stats["value_loss"])
    after = actor.get_weights()
    changed = [k for k in after if not torch.equal(before[k], after[k])]
    assert any(k.startswith("vla.model.") for k in changed)
    assert "vla.value_head.weight" in changed
    worker.set_weights(after)
    synced = worker.get_weights()
    assert all(torch.equal(synced[k], after[k]) for k in after)


def test_bad_folders_configs_and_shapes_are_clear(folder, tmp_path: Path):
    with pytest.raises(ConfigError, match="does not exist"):
        PretrainedVLA(network(str(tmp_path / "missing")), seed=0)
    (tmp_path / "empty").mkdir()
    with pytest.raises(ConfigError, match="cannot load"):
        PretrainedVLA(network(str(tmp_path / "empty")), seed=0)
    with pytest.raises(ConfigError, match="exceeds the tokenizer"):
        PretrainedVLA(network(folder, num_bins=1000), seed=0)
    with pytest.raises(ConfigError, match="cameras"):
        network(folder, camera=2)
    with pytest.raises(ConfigError, match="stacked RGB"):
        network(folder, image_shape=(4, 16, 16))
    with pytest.raises(ConfigError, match="instruction"):
        network(folder, prompt="What should the robot do?")
    vla = PretrainedVLA(network(folder), seed=0)
    with pytest.raises(ShapeError, match="expected images"):
        vla.value(torch.zeros(1, 3, 16, 16, dtype=torch.uint8), ["x"])
    with pytest.raises(ShapeError, match="expected tokens"):
        vla.evaluate(frames(1), ["x"], torch.zeros(1, 2, dtype=torch.long))
