import numpy as np
import pytest
import torch

from rlinf.comm import Batch
from rlinf.workers.embodied import PolicyRolloutConfig, PolicyRolloutWorker
from rlinf.workers.errors import ConfigError, ShapeError
from rlinf.workers.models import PolicyConfig

from .conftest import CONTEXT


def _worker(policy: PolicyConfig, **options) -> PolicyRolloutWorker:
    return PolicyRolloutWorker(CONTEXT, config=PolicyRolloutConfig(policy=policy, **options))


def _obs_batch(obs, env_index, *, final_mask=None, bootstrap=False):
    n = len(env_index)
    mask = np.zeros(n, bool) if final_mask is None else np.asarray(final_mask)
    return Batch({"obs": obs, "final_obs": obs * 2, "final_mask": mask,
                  "env_index": np.asarray(env_index, dtype=np.int64)},
                 meta={"stage": 0, "step": 0, "bootstrap": bootstrap})


def test_gaussian_reply_matches_the_model_log_prob_and_value():
    worker = _worker(PolicyConfig(obs_shape=(5,), action_dim=2))
    obs = np.random.default_rng(0).normal(size=(4, 5)).astype(np.float32)
    reply = worker.infer(_obs_batch(obs, [0, 1, 2, 3], final_mask=[False, True, False, False]))
    assert reply.tensors["action"].shape == (4, 2)
    ev = worker.model.evaluate(torch.from_numpy(obs), torch.from_numpy(reply.tensors["action"]))
    np.testing.assert_allclose(reply.tensors["log_prob"], ev.log_prob.detach(), atol=1e-5)
    np.testing.assert_allclose(reply.tensors["value"], ev.value.detach(), atol=1e-6)
    final = reply.tensors["final_value"]
    assert final[0] == 0 and final[2] == 0
    expected = worker.model.value(torch.from_numpy(obs[1:2] * 2)).item()
    assert final[1] == pytest.approx(expected, abs=1e-5)


def test_actions_depend_on_env_index_not_on_batching():
    policy = PolicyConfig(obs_shape=(3,), action_dim=2)
    obs = np.ones((4, 3), np.float32)
    together = _worker(policy, seed=1).infer(_obs_batch(obs, [0, 1, 2, 3])).tensors["action"]
    split = _worker(policy, seed=1)
    second = split.infer(_obs_batch(obs[2:], [2, 3])).tensors["action"]  # served first
    first = split.infer(_obs_batch(obs[:2], [0, 1])).tensors["action"]
    np.testing.assert_array_equal(together, np.concatenate([first, second]))
    # identical observations, different envs → different samples
    assert not np.array_equal(together[0], together[1])


def test_bootstrap_batches_get_values_only_and_consume_no_noise():
    policy = PolicyConfig(obs_shape=(3,), action_dim=1)
    obs = np.zeros((2, 3), np.float32)
    a, b = _worker(policy), _worker(policy)
    reply = a.infer(_obs_batch(obs, [0, 1], bootstrap=True))
    assert set(reply.tensors) == {"value", "final_value"}
    np.testing.assert_array_equal(a.infer(_obs_batch(obs, [0, 1])).tensors["action"],
                                  b.infer(_obs_batch(obs, [0, 1])).tensors["action"])


def test_deterministic_mode_acts_with_the_mean():
    worker = _worker(PolicyConfig(obs_shape=(3,), action_dim=2), deterministic=True)
    obs = np.random.default_rng(1).normal(size=(3, 3)).astype(np.float32)
    action = worker.infer(_obs_batch(obs, [0, 1, 2])).tensors["action"]
    mean = worker.model.policy_params(torch.from_numpy(obs)).detach().numpy()
    np.testing.assert_allclose(action, mean, atol=1e-6)


def test_discrete_pixels_policy_samples_valid_actions():
    worker = _worker(PolicyConfig(obs_shape=(3, 16, 16), action_dim=5, discrete=True))
    obs = np.random.default_rng(2).integers(0, 255, size=(6, 3, 16, 16), dtype=np.uint8)
    reply = worker.infer(_obs_batch(obs, list(range(6))))
    action = reply.tensors["action"]
    assert action.dtype == np.int64 and ((action >= 0) & (action < 5)).all()
    ev = worker.model.evaluate(torch.from_numpy(obs), torch.from_numpy(action))
    np.testing.assert_allclose(reply.tensors["log_prob"], ev.log_prob.detach(), atol=1e-5)


def test_weights_round_trip():
    policy = PolicyConfig(obs_shape=(3,), action_dim=1)
    a, b = _worker(policy, seed=0), _worker(policy, seed=1)
    b.set_weights(a.get_weights())
    for (ka, va), (kb, vb) in zip(a.model.state_dict().items(), b.model.state_dict().items(),
                                  strict=True):
        assert ka == kb and torch.equal(va, vb)


def test_serve_rejects_empty_work():
    from rlinf.workers.env import KeyedQueue

    worker = _worker(PolicyConfig(obs_shape=(3,), action_dim=1))
    with pytest.raises(ConfigError):
        worker.serve(source=KeyedQueue(), sink=KeyedQueue(), num_steps=0, num_stages=1)


@pytest.mark.parametrize("deterministic", [False, True])
def test_numpy_path_answers_as_the_torch_path(deterministic):
    policy = PolicyConfig(obs_shape=(17,), action_dim=6, hidden_sizes=(64, 64))
    fast, plain = (_worker(policy, seed=4, deterministic=deterministic) for _ in range(2))
    plain._arrays = None  # the torch path
    assert fast._arrays is not None
    rng = np.random.default_rng(1)
    weights = {k: v + 0.1 * torch.randn(v.shape) for k, v in fast.get_weights().items()}
    for worker in (fast, plain):
        worker.set_weights(weights)  # loaded in place: the NumPy views see the new weights
    for step in range(5):
        obs = rng.normal(size=(8, 17)).astype(np.float64)  # float64 from the env, as MuJoCo's
        batch = _obs_batch(obs, range(8), final_mask=rng.random(8) < 0.3,
                           bootstrap=step == 4)
        got, want = fast.infer(batch), plain.infer(batch)
        assert got.tensors.keys() == want.tensors.keys()
        for key, value in want.tensors.items():
            assert got.tensors[key].dtype == value.dtype == np.float32, key
            np.testing.assert_allclose(got.tensors[key], value, rtol=1e-5, atol=1e-5,
                                       err_msg=key)
    fast.offload()
    fast.onload()
    np.testing.assert_allclose(fast.infer(batch).tensors["value"], want.tensors["value"],
                               rtol=1e-5, atol=1e-5)
    with pytest.raises(ShapeError, match=r"\[N, 17\]"):
        fast.infer(_obs_batch(np.zeros((2, 5), np.float32), [0, 1]))
