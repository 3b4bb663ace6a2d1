from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from rlinf.workers.errors import ConfigError
from rlinf.workers.telemetry import Span, plot_learning_curve, plot_timeline


def _pixels(path: Path) -> np.ndarray:
    assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    return np.asarray(Image.open(path).convert("RGB"))


def test_learning_curve_draws_each_metric(tmp_path: Path) -> None:
    records = [{"step": s, "loss": 1.0 / (s + 1), **({"eval": 0.1 * s} if s % 5 == 0 else {})}
               for s in range(20)]
    one = _pixels(plot_learning_curve(records, ys=["loss"], path=tmp_path / "a.png"))
    two = _pixels(plot_learning_curve(records, ys=["loss", "eval"], path=tmp_path / "b.png",
                                      title="run"))
    assert two.shape[0] > one.shape[0]  # one panel per metric
    assert (one < 250).any()  # something was drawn, not a blank canvas


def test_learning_curve_names_a_missing_metric(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match=r"'reward'.*\['loss', 'step'\]"):
        plot_learning_curve([{"step": 0, "loss": 1.0}], ys=["reward"], path=tmp_path / "x.png")
    with pytest.raises(ConfigError, match="at least one"):
        plot_learning_curve([{"step": 0}], ys=[], path=tmp_path / "x.png")


def test_timeline_puts_measured_above_predicted(tmp_path: Path) -> None:
    measured = [Span("rollout/0", "rollout", 10.0, 12.0), Span("actor/0", "actor", 12.0, 13.0)]
    predicted = [Span("rollout", "rollout", 10.0, 11.5), Span("actor", "actor", 11.5, 12.2)]
    both = _pixels(plot_timeline(tmp_path / "t.png", measured, predicted))
    only = _pixels(plot_timeline(tmp_path / "m.png", measured))
    assert both.shape[0] > only.shape[0]
    assert both.shape[1] == only.shape[1]
    # the measured rank and the predicted component of one role share a colour: tab10's
    # first (actor sorts first) appears in the upper and in the lower panel
    blue = np.all(np.abs(both.astype(int) - (31, 119, 180)) <= 2, axis=-1)
    rows = np.nonzero(blue.any(axis=1))[0]
    half = both.shape[0] // 2
    assert (rows < half).any() and (rows > half).any()
    with pytest.raises(ConfigError, match="no spans"):
        plot_timeline(tmp_path / "e.png", [])


def test_measured_onload_and_offload_are_drawn_as_switches(tmp_path: Path) -> None:
    # The device-lock turns workers record (onload/offload) get the simulator's switch look:
    # light grey bars, no role colour of their own.
    grey = (211, 211, 211)

    def has_grey(spans: list[Span]) -> bool:
        image = _pixels(plot_timeline(tmp_path / "t.png", spans)).astype(int)
        return bool(np.all(np.abs(image - grey) <= 2, axis=-1).sum() > 200)

    work = [Span("actor/0", "train", 0.0, 1.0)]
    assert not has_grey(work)
    for name in ("onload", "offload", "switch"):
        assert has_grey([*work, Span("actor/0", name, 1.0, 3.0)]), name
