import pytest
import torch

from rlinf.workers.embodied.vla import TinyVLA, VLAConfig
from rlinf.workers.errors import ConfigError, ShapeError

CONFIG = VLAConfig(image_shape=(3, 16, 16), action_dim=3, num_bins=16, patch_size=8,
                   max_instruction_tokens=12)
INSTRUCTIONS = ["1+2", "pick 3", "7*8=?", ""]


def _images(n=4, seed=0):
    g = torch.Generator().manual_seed(seed)
    return torch.randint(0, 256, (n, 3, 16, 16), generator=g, dtype=torch.uint8)


def test_sampled_log_probs_match_teacher_forced_evaluation():
    vla = TinyVLA(CONFIG, seed=0).eval()
    images = _images()
    sample = vla.act(images, INSTRUCTIONS, generator=torch.Generator().manual_seed(1))
    assert sample.tokens.shape == (4, 3)
    assert ((sample.tokens >= 0) & (sample.tokens < 16)).all()
    assert (sample.action.abs() < 1).all()
    log_prob, entropy, value = vla.evaluate(images, INSTRUCTIONS, sample.tokens)
    torch.testing.assert_close(log_prob.detach(), sample.log_prob, atol=1e-4, rtol=0)
    torch.testing.assert_close(value.detach(), sample.value, atol=1e-5, rtol=0)
    assert (entropy > 0).all()


def test_instruction_changes_the_action_distribution_and_gradients_flow():
    vla = TinyVLA(CONFIG, seed=0)
    tokens = torch.zeros(2, 3, dtype=torch.long)
    same_image = _images(1).repeat(2, 1, 1, 1)
    log_prob, _, value = vla.evaluate(same_image, ["1+2", "9*9"], tokens)
    assert log_prob[0] != log_prob[1]
    (log_prob.sum() + value.sum()).backward()
    assert vla.patch_embed.weight.grad is not None
    assert vla.patch_embed.weight.grad.abs().sum() > 0


def test_same_seed_same_model_and_deterministic_decoding():
    a, b = TinyVLA(CONFIG, seed=3).eval(), TinyVLA(CONFIG, seed=3).eval()
    images = _images()
    first = a.act(images, INSTRUCTIONS, deterministic=True)
    second = b.act(images, INSTRUCTIONS, deterministic=True)
    assert torch.equal(first.tokens, second.tokens)


def test_bins_round_trip():
    vla = TinyVLA(CONFIG, seed=0)
    tokens = torch.arange(16).reshape(-1, 1)
    assert torch.equal(vla.action_to_tokens(vla.tokens_to_action(tokens)), tokens)
    assert vla.action_to_tokens(torch.tensor([-5.0, 1.0, 5.0])).tolist() == [0, 15, 15]


def test_bad_shapes_and_configs_are_rejected():
    with pytest.raises(ConfigError):
        VLAConfig(image_shape=(3, 15, 16), action_dim=2)
    vla = TinyVLA(CONFIG, seed=0)
    with pytest.raises(ShapeError):
        vla.act(_images(2), ["only one"])
    with pytest.raises(ShapeError):
        vla.evaluate(_images(2), ["a", "b"], torch.zeros(2, 2, dtype=torch.long))
