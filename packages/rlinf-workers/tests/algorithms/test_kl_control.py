"""The KL reward penalty and its fixed and adaptive controllers, against hand-computed values."""

from __future__ import annotations

import pytest
import torch

from rlinf.workers.algorithms import KLController, kl_reward_penalty
from rlinf.workers.errors import ConfigError

T = torch.tensor


def test_a_fixed_controller_keeps_its_coefficient() -> None:
    fixed = KLController(kind="fixed", coef=0.02)
    assert fixed.update(5.0, responses=1000) == 0.02
    assert fixed.value == 0.02


def test_an_adaptive_controller_moves_toward_the_target() -> None:
    ctrl = KLController(kind="adaptive", coef=0.1, target=0.1, horizon=1000)
    # kl 0.15: error 0.5, clipped to 0.2; 100 responses: x (1 + 0.2 * 100 / 1000) = x 1.02
    assert ctrl.update(0.15, responses=100) == pytest.approx(0.102)
    # kl 0.09: error -0.1 (inside the clip): x (1 - 0.1 * 100 / 1000) = x 0.99
    assert ctrl.update(0.09, responses=100) == pytest.approx(0.102 * 0.99)
    # kl 0: error -1, clipped to -0.2; 500 responses: x (1 - 0.2 * 0.5) = x 0.9
    assert ctrl.update(0.0, responses=500) == pytest.approx(0.102 * 0.99 * 0.9)


def test_bad_controllers_are_refused() -> None:
    with pytest.raises(ConfigError, match="'fixed' or 'adaptive'"):
        KLController(kind="pid", coef=0.1)  # type: ignore[arg-type]
    with pytest.raises(ConfigError, match="must be > 0"):
        KLController(kind="fixed", coef=0.0)
    with pytest.raises(ConfigError, match="target_kl > 0 and kl_horizon >= 1"):
        KLController(kind="adaptive", coef=0.1, horizon=0)


def test_the_penalty_is_coef_times_the_token_kl_and_the_kl_a_mean_per_response() -> None:
    # k1 = log pi - log ref. row 0: [0.5, -1.0] (third token padding); row 1: [0.2];
    # row 2: empty. penalty = 0.1 * kl on valid tokens, 0 elsewhere.
    log_probs = T([[-1.0, -2.0, -3.0], [-0.5, -9.0, -9.0], [-1.0, -1.0, -1.0]])
    ref = T([[-1.5, -1.0, -0.5], [-0.7, -1.0, -1.0], [-2.0, -2.0, -2.0]])
    mask = T([[1, 1, 0], [1, 0, 0], [0, 0, 0]])
    out = kl_reward_penalty(log_probs, ref, mask, coef=0.1, estimator="kl")
    torch.testing.assert_close(out.penalty, T([[0.05, -0.1, 0.0], [0.02, 0.0, 0.0],
                                               [0.0, 0.0, 0.0]]))
    # per response: (0.5 - 1) / 2 = -0.25 and 0.2; the empty one does not count
    assert out.kl_sum == pytest.approx(-0.05)
    assert out.responses == 2
    # k2 = log_ratio^2 / 2: row 0 [0.125, 0.5], row 1 [0.02]
    k2 = kl_reward_penalty(log_probs, ref, mask, coef=1.0, estimator="k2")
    torch.testing.assert_close(k2.penalty[:2, :2], T([[0.125, 0.5], [0.02, 0.0]]))
