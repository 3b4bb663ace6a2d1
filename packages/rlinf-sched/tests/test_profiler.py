"""Profiler: measurements, JSON profiles, and cost-curve fits on synthetic data."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from rlinf.sched import CostModel, ProfileError
from rlinf.sched.profiler import (
    Measurement,
    Profile,
    Profiler,
    fit_curve,
    fit_profile,
)


def test_measure_records_time_and_peak_memory() -> None:
    profiler = Profiler(metadata={"model": "tiny"})
    with profiler.measure("rollout", batch_size=16, num_devices=2):
        block = np.ones(64 * 2**20 // 8)  # 64 MiB touched inside the block
        block.sum()
    (m,) = profiler.profile.measurements
    assert (m.component, m.batch_size, m.num_devices) == ("rollout", 16, 2)
    assert m.seconds > 0
    assert m.memory_source in ("rss", "cuda")
    if m.memory_source == "rss":
        assert m.peak_memory_bytes >= 64 * 2**20
    assert profiler.profile.metadata == {"model": "tiny"}


def test_measure_records_nothing_when_the_block_raises() -> None:
    profiler = Profiler(track_memory=False)
    with pytest.raises(RuntimeError), profiler.measure("actor", batch_size=1, num_devices=1):
        raise RuntimeError("boom")
    assert profiler.profile.measurements == ()


def test_save_and_load(tmp_path: Path) -> None:
    profiler = Profiler(track_memory=False, metadata={"cluster": "cpu"})
    for b in (1, 2, 4):
        with profiler.measure("actor", batch_size=b, num_devices=1):
            pass
    profiler.record_switch("actor", "offload", 0.25, device=0)
    profiler.record_switch("actor", "onload", 0.5, device=0)
    saved = profiler.save(tmp_path / "p" / "actor.json")
    loaded = Profile.load(tmp_path / "p" / "actor.json")
    assert loaded == saved
    other = Profile((Measurement("env", 8, 1, 0.1, 0, "none"),))
    other.save(tmp_path / "p" / "env.json")
    merged = Profile.load(tmp_path / "p")  # a directory: every *.json merged
    assert merged.components == ("actor", "env")
    assert len(merged.measurements) == 4
    assert json.loads((tmp_path / "p" / "env.json").read_text())["format"] == "rlinf-profile/1"


def test_load_rejects_foreign_files(tmp_path: Path) -> None:
    path = tmp_path / "x.json"
    path.write_text(json.dumps({"format": "something-else"}))
    with pytest.raises(ProfileError, match="expected format 'rlinf-profile/1'"):
        Profile.load(path)
    (tmp_path / "empty").mkdir()
    with pytest.raises(ProfileError, match="no profile files"):
        Profile.load(tmp_path / "empty")
    with pytest.raises(ProfileError, match="cannot read profile"):
        Profile.load(tmp_path / "missing.json")


def test_fit_recovers_known_coefficients() -> None:
    rng = np.random.default_rng(7)
    a, b, c, noise = 0.5, 0.02, 0.001, 0.005
    points = [
        (batch, dev, a + b * batch / dev + c * batch + rng.normal(0, noise))
        for batch in (8, 16, 32, 64, 128, 256)
        for dev in (1, 2, 4, 8)
        for _ in range(3)
    ]
    curve = fit_curve(points)
    want = {"const": a, "batch_per_device": b, "batch": c}
    for name, got, se in zip(curve.features, curve.coefficients, curve.stderr, strict=True):
        assert abs(got - want[name]) < 5 * se + 1e-9, (name, got, want[name], se)
    assert 0.5 * noise < curve.residual_std < 2 * noise
    mean, std = curve.predict(batch_size=100, num_devices=4)
    assert abs(mean - (a + b * 25 + c * 100)) < 3 * std
    assert std >= curve.residual_std


def test_fit_exact_data_without_noise() -> None:
    points = [(bt, d, 1.0 + 0.5 * bt / d + 0.25 * bt) for bt in (2, 4, 8) for d in (1, 2)]
    curve = fit_curve(points)
    assert dict(zip(curve.features, curve.coefficients, strict=True)) == pytest.approx(
        {"const": 1.0, "batch_per_device": 0.5, "batch": 0.25})
    assert curve.residual_std == pytest.approx(0.0, abs=1e-9)


def test_one_measured_point_scales_with_the_items_per_device() -> None:
    # A component measured at one batch and device count only (a run that prices itself
    # from its own steps): the fit cannot tell fixed from parallel cost, and assumes the
    # data-parallel one, so half the devices cost twice as much, not the same.
    curve = fit_curve([(64, 2, 1.0), (64, 2, 1.2), (64, 2, 1.1)])
    assert curve.predict(batch_size=64, num_devices=2)[0] == pytest.approx(1.1)
    assert curve.predict(batch_size=64, num_devices=1)[0] == pytest.approx(2.2)
    assert curve.predict(batch_size=128, num_devices=2)[0] == pytest.approx(2.2)


def test_repeated_points_count_as_their_median_so_one_outlier_moves_nothing() -> None:
    exact = [(bt, d, 1.0 + 0.5 * bt / d + 0.25 * bt) for bt in (2, 8) for d in (1, 2)]
    # three timings of every point, one of them 3x slow (a hiccup of a shared machine)
    repeated = [(bt, d, y * k) for bt, d, y in exact for k in (1.0, 3.0, 1.0)]
    curve = fit_curve(repeated)
    assert dict(zip(curve.features, curve.coefficients, strict=True)) == pytest.approx(
        {"const": 1.0, "batch_per_device": 0.5, "batch": 0.25})
    assert curve.num_points == len(exact)


def test_fit_drops_features_the_data_cannot_separate() -> None:
    # One device count: batch and batch/devices are collinear; the fit must stay exact.
    points = [(bt, 2, 3.0 + 0.5 * bt) for bt in (1, 2, 4, 8)]
    curve = fit_curve(points)
    assert curve(batch_size=16, num_devices=2) == pytest.approx(3.0 + 8.0)
    assert curve.coefficients[curve.features.index("batch")] == 0.0
    with pytest.raises(ProfileError, match="no points"):
        fit_curve([])


def test_fitted_cost_model_is_a_cost_model() -> None:
    profile = Profile(
        tuple(
            Measurement("rollout", bt, d, 0.1 + 0.01 * bt / d, 1000 + 10 * bt // d, "rss")
            for bt in (4, 8, 16)
            for d in (1, 2)
        )
    )
    profiler = Profiler(track_memory=False)
    for secs in (0.2, 0.4):
        profiler.record_switch("rollout", "offload", secs)
        profiler.record_switch("rollout", "onload", secs / 2)
    model = fit_profile(profile.merge(profiler.profile))
    assert isinstance(model, CostModel)
    assert model.time("rollout", batch_size=32, num_devices=4) == pytest.approx(0.1 + 0.08)
    assert model.memory("rollout", batch_size=32, num_devices=4) == pytest.approx(1080, abs=2)
    assert model.switch_time("rollout") == pytest.approx(0.3 + 0.15)
    assert model.switch_time("never-switched") == 0.0
    with pytest.raises(ProfileError, match="no profile for component 'actor'"):
        model.time("actor", batch_size=1, num_devices=1)


def test_invalid_measurements() -> None:
    with pytest.raises(ProfileError, match="batch_size=0"):
        Measurement("x", 0, 1, 0.1, 0)
    with pytest.raises(ProfileError, match="finite non-negative"):
        Measurement("x", 1, 1, float("nan"), 0)
    with pytest.raises(ProfileError, match="'onload' or 'offload'"):
        Profiler().record_switch("x", "sideways", 0.1)
