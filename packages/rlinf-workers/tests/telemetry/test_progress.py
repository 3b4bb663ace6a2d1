from __future__ import annotations

import io

import pytest

from rlinf.workers.errors import ConfigError
from rlinf.workers.telemetry import ProgressDisplay
from rlinf.workers.telemetry.progress import format_duration


class FakeClock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


class FakeTTY(io.StringIO):
    def isatty(self) -> bool:
        return True


def test_plain_stream_prints_at_most_every_interval_plus_the_last() -> None:
    out, clock = io.StringIO(), FakeClock()
    bar = ProgressDisplay(10, desc="train", stream=out, interval=5.0, clock=clock)
    for step in range(1, 11):
        clock.now = float(step)  # one step per second
        bar.update(step, {"loss": 1.0 / step, "reward": 0.5, "lr": 3e-6})
    lines = out.getvalue().splitlines()
    assert [line.split(" |")[0] for line in lines] == [
        "train 1/10 ( 10%)", "train 6/10 ( 60%)", "train 10/10 (100%)"]
    assert "1 step/s" in lines[1] and "eta 0:04" in lines[1]
    assert "loss=0.1 reward=0.5 lr=3.000e-06" in lines[2]


def test_close_prints_the_last_pending_update_once() -> None:
    out, clock = io.StringIO(), FakeClock()
    bar = ProgressDisplay(100, desc="d", start=40, stream=out, interval=60.0, clock=clock,
                          keys=["reward"])
    clock.now = 2.0
    bar.update(41, {"loss": 1.0, "reward": 2.0})
    clock.now = 10.0
    bar.update(50, {"loss": 1.0, "reward": 3.0})
    bar.close()
    bar.close()
    lines = out.getvalue().splitlines()
    assert len(lines) == 2 and lines[1].startswith("d 50/100")
    assert "reward=3" in lines[1] and "loss" not in lines[1]
    assert "1 step/s" in lines[1]  # 10 steps since start=40, in 10 s
    assert "eta 0:50" in lines[1]


def test_tty_redraws_one_line_in_place() -> None:
    out, clock = FakeTTY(), FakeClock()
    with ProgressDisplay(3, desc="x", stream=out, clock=clock) as bar:
        for step in (1, 2, 3):
            clock.now = step * 0.5
            bar.update(step, {"m": 1.0})
    text = out.getvalue()
    assert text.count("\r") == 3 and text.endswith("\n") and text.count("\n") == 1
    assert "x 3/3" in text and "2 step/s" in text


def test_format_duration_and_bad_totals() -> None:
    assert format_duration(3725) == "1:02:05"
    assert format_duration(65) == "1:05"
    assert format_duration(float("nan")) == "?"
    with pytest.raises(ConfigError):
        ProgressDisplay(-1, desc="x")
