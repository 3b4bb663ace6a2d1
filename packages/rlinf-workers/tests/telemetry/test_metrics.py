from __future__ import annotations

import json
import math
import os
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest

from rlinf.workers.errors import ConfigError
from rlinf.workers.telemetry import MetricsWriter, read_metrics


def _scalars(run_dir: Path, tag: str) -> list[tuple[int, float]]:
    from tensorboard.backend.event_processing import event_accumulator

    acc = event_accumulator.EventAccumulator(str(run_dir / "tensorboard"))
    acc.Reload()
    return [(e.step, e.value) for e in acc.Scalars(tag)]


def test_records_hold_step_time_then_metrics(tmp_path: Path) -> None:
    with MetricsWriter(tmp_path, tensorboard=False) as w:
        w.write(1, {"loss": 0.5, "reward": np.float32(0.25), "tokens": 128})  # type: ignore[dict-item]
        w.write(2, {"loss": 0.25})
    lines = (tmp_path / "metrics.jsonl").read_text().splitlines()
    first = json.loads(lines[0])
    assert list(first)[:2] == ["step", "time"]
    assert first["step"] == 1 and first["loss"] == 0.5 and first["reward"] == 0.25
    assert first["tokens"] == 128 and isinstance(first["tokens"], int)
    assert [r["step"] for r in read_metrics(tmp_path)] == [1, 2]


def test_each_write_is_on_disk_before_close(tmp_path: Path) -> None:
    w = MetricsWriter(tmp_path, tensorboard=False)
    w.write(7, {"x": 1.0})
    assert read_metrics(tmp_path / "metrics.jsonl")[0]["x"] == 1.0
    w.close()


def test_torn_last_line_is_dropped_on_open_and_skipped_on_read(tmp_path: Path) -> None:
    path = tmp_path / "metrics.jsonl"
    path.write_text('{"step": 1, "time": 0, "x": 1}\n{"step": 2, "time": 0, "x"')
    assert [r["step"] for r in read_metrics(path)] == [1]
    with MetricsWriter(tmp_path, tensorboard=False) as w:
        w.write(2, {"x": 2.0})
    assert [r["step"] for r in read_metrics(path)] == [1, 2]


def test_corrupt_middle_line_is_an_error(tmp_path: Path) -> None:
    path = tmp_path / "metrics.jsonl"
    path.write_text('{"step": 1}\nnot json\n{"step": 2}\n')
    with pytest.raises(ConfigError, match="corrupt"):
        read_metrics(path)


def test_resume_step_drops_records_to_be_redone(tmp_path: Path) -> None:
    with MetricsWriter(tmp_path, tensorboard=False) as w:
        for s in range(6):
            w.write(s, {"x": float(s)})
    with MetricsWriter(tmp_path, tensorboard=False, resume_step=3) as w:
        assert [r["step"] for r in read_metrics(tmp_path)] == [0, 1, 2]
        w.write(3, {"x": 30.0})
    assert [(r["step"], r["x"]) for r in read_metrics(tmp_path)][-2:] == [(2, 2.0), (3, 30.0)]


def test_bad_metrics_are_rejected_with_their_name(tmp_path: Path) -> None:
    with MetricsWriter(tmp_path, tensorboard=False) as w:
        with pytest.raises(ConfigError, match="'name'"):
            w.write(1, {"name": "abc"})  # type: ignore[dict-item]
        with pytest.raises(ConfigError, match="reserved"):
            w.write(1, {"step": 3.0})
    with pytest.raises(ConfigError, match="closed"):
        w.write(2, {"x": 1.0})


def test_tensorboard_scalars_read_back(tmp_path: Path) -> None:
    with MetricsWriter(tmp_path) as w:
        for s in range(4):
            w.write(s, {"loss": 1.0 / (s + 1), "nan_metric": math.nan})
    got = _scalars(tmp_path, "loss")
    assert [s for s, _ in got] == [0, 1, 2, 3]
    assert [v for _, v in got] == pytest.approx([1.0, 0.5, 1 / 3, 0.25])
    assert read_metrics(tmp_path)[0]["nan_metric"] != read_metrics(tmp_path)[0]["nan_metric"]


def test_tensorboard_purges_redone_steps_on_resume(tmp_path: Path) -> None:
    with MetricsWriter(tmp_path) as w:
        for s in range(5):
            w.write(s, {"loss": float(s)})
    with MetricsWriter(tmp_path, resume_step=2) as w:
        for s in range(2, 4):
            w.write(s, {"loss": 10.0 * s})
    got = dict(_scalars(tmp_path, "loss"))
    assert got == {0: 0.0, 1: 1.0, 2: 20.0, 3: 30.0}


_KILLED_WRITER = textwrap.dedent("""
    import sys, time
    from pathlib import Path
    from rlinf.workers.telemetry import MetricsWriter

    w = MetricsWriter(Path(sys.argv[1]), tensorboard=False)
    for step in range(5):
        w.write(step, {"x": float(step)})
    print("written", flush=True)
    time.sleep(60)
""")


def test_sigkill_after_writes_loses_nothing(tmp_path: Path) -> None:
    proc = subprocess.Popen([sys.executable, "-c", _KILLED_WRITER, str(tmp_path)],
                            stdout=subprocess.PIPE, text=True)
    try:
        assert proc.stdout is not None
        for line in proc.stdout:
            if line.strip() == "written":
                break
        os.kill(proc.pid, signal.SIGKILL)
    finally:
        if proc.poll() is None:
            proc.kill()
        proc.wait(timeout=30)
        if proc.stdout is not None:
            proc.stdout.close()
    assert [r["x"] for r in read_metrics(tmp_path)] == [0.0, 1.0, 2.0, 3.0, 4.0]
