"""The tiny VLA behind the rollout protocol and the PPO actor."""

import numpy as np
import pytest
import torch

from rlinf.comm import Batch
from rlinf.workers.embodied import EmbodiedActorConfig, EmbodiedActorWorker
from rlinf.workers.embodied.profiling import synthetic_trajectory
from rlinf.workers.embodied.vla import VLAConfig
from rlinf.workers.embodied.vla_policy import (
    VLAActorCritic,
    VLAPolicyConfig,
    VLARolloutConfig,
    VLARolloutWorker,
)
from rlinf.workers.errors import ConfigError, ShapeError

from .conftest import CONTEXT

NETWORK = VLAConfig(image_shape=(3, 16, 16), action_dim=2, num_bins=8, hidden_size=32,
                    num_heads=2, max_instruction_tokens=8)
POLICY = VLAPolicyConfig(vla=NETWORK, action_low=(-3.0, 0.0), action_high=(3.0, 1.0),
                         instruction="push")


def frames(count: int, seed: int = 0) -> np.ndarray:
    return np.random.default_rng(seed).integers(0, 256, (count, 3, 16, 16), dtype=np.uint8)


def test_rollout_worker_answers_the_protocol_within_the_action_box():
    worker = VLARolloutWorker(CONTEXT, config=VLARolloutConfig(policy=POLICY, seed=1))
    obs = frames(3)
    mask = np.array([False, True, False])
    reply = worker.infer(Batch({"obs": obs, "final_obs": frames(3, 1), "final_mask": mask,
                                "env_index": np.arange(3)}))
    action = reply.tensors["action"]
    assert action.shape == (3, 2)
    assert (action[:, 0] >= -3).all() and (action[:, 0] <= 3).all()
    assert (action[:, 1] >= 0).all() and (action[:, 1] <= 1).all()
    assert reply.tensors["final_value"][0] == 0 and reply.tensors["final_value"][1] != 0
    boot = worker.infer(Batch({"obs": obs, "final_obs": obs, "final_mask": ~mask,
                               "env_index": np.arange(3)}, meta={"bootstrap": True}))
    assert "action" not in boot.tensors
    np.testing.assert_allclose(boot.tensors["value"], reply.tensors["value"], atol=1e-5)


def test_env_actions_map_back_to_their_tokens():
    model = VLAActorCritic(POLICY, seed=0)
    tokens = torch.tensor([[0, 7], [3, 4], [7, 0]])
    assert torch.equal(model.to_tokens(model.to_env(model.vla.tokens_to_action(tokens))), tokens)


def test_sampled_log_probs_match_evaluate_and_state_resumes_sampling():
    worker = VLARolloutWorker(CONTEXT, config=VLARolloutConfig(policy=POLICY, seed=2))
    obs = frames(4)
    batch = Batch({"obs": obs, "final_obs": obs, "final_mask": np.zeros(4, bool),
                   "env_index": np.arange(4)})
    saved = worker.state()
    first = worker.infer(batch).tensors
    evaluated = worker.model.evaluate(torch.from_numpy(obs), torch.from_numpy(first["action"]))
    np.testing.assert_allclose(evaluated.log_prob.detach().numpy(), first["log_prob"],
                               atol=1e-4)
    worker.load_state(saved)
    np.testing.assert_array_equal(worker.infer(batch).tensors["action"], first["action"])


def test_actor_trains_the_vla_with_ppo():
    actor = EmbodiedActorWorker(CONTEXT, config=EmbodiedActorConfig(
        policy=POLICY, epochs=1, num_minibatches=2, lr=1e-3))
    before = {k: v.clone() for k, v in actor.get_weights().items()}
    stats = actor.train(synthetic_trajectory(frames(2), (2,), steps=3))
    assert np.isfinite(stats["policy_loss"]) and np.isfinite(stats["value_loss"])
    after = actor.get_weights()
    assert not torch.equal(before["vla.patch_embed.weight"], after["vla.patch_embed.weight"])


def test_bad_vla_configs_and_shapes_are_rejected():
    with pytest.raises(ConfigError, match="2 action bounds"):
        VLAPolicyConfig(vla=NETWORK, action_low=(0.0,), action_high=(1.0,), instruction="")
    with pytest.raises(ConfigError, match="exceed"):
        VLAPolicyConfig(vla=NETWORK, action_low=(1.0, 1.0), action_high=(1.0, 2.0),
                        instruction="")
    with pytest.raises(ConfigError, match="policy is None"):
        EmbodiedActorWorker(CONTEXT, config=EmbodiedActorConfig())
    with pytest.raises(ShapeError, match="pixels"):
        VLAActorCritic(POLICY, seed=0).value(torch.zeros(1, 3, 8, 8, dtype=torch.uint8))


@pytest.mark.gpu
def test_rollout_worker_runs_on_cuda():
    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA GPU")
    worker = VLARolloutWorker(CONTEXT, config=VLARolloutConfig(policy=POLICY, seed=1,
                                                              device="cuda"))
    obs = frames(3)
    reply = worker.infer(Batch({"obs": obs, "final_obs": obs, "final_mask": np.ones(3, bool),
                                "env_index": np.arange(3)}))
    assert reply.tensors["action"].shape == (3, 2)
    assert np.isfinite(reply.tensors["final_value"]).all()
