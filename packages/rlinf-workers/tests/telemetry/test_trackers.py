"""Experiment trackers mirrored by `MetricsWriter`: wandb offline (no login, no network) and
MLflow's local file store, read back the way their users read them; a resumed writer logs
into the same tracker run."""

from __future__ import annotations

import glob
import struct
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from rlinf.workers.errors import ConfigError
from rlinf.workers.telemetry import MetricsWriter, open_tracker

pytest.importorskip("wandb", reason="the wandb extra (tox's test-workers installs it)")
pytest.importorskip("mlflow", reason="the mlflow extra (tox's test-workers installs it)")

CONFIG = {"algorithm.lr": 0.001, "run.steps": 3, "model.dir": None}


@pytest.fixture
def no_login(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """No wandb credentials and no tracker settings from the environment."""
    for name in ("WANDB_API_KEY", "WANDB_MODE", "WANDB_PROJECT", "WANDB_ENTITY",
                 "MLFLOW_TRACKING_URI", "MLFLOW_EXPERIMENT_NAME"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("NETRC", str(tmp_path / "no-netrc"))


def tracked(run_dir: Path, tracker: str, run_name: str, *,
            resume_step: int | None = None) -> MetricsWriter:
    """A writer mirroring to `tracker` only (no TensorBoard), with `CONFIG` as parameters."""
    return MetricsWriter(run_dir, tensorboard=False, trackers=[tracker], run_name=run_name,
                         config=CONFIG, resume_step=resume_step)


def _wandb_records(path: str) -> Iterator[bytes]:
    """The records of a ``.wandb`` file: a ``:W&B`` header, then LevelDB-log blocks of
    32 KiB whose records may be split FIRST/MIDDLE/LAST across blocks."""
    data = Path(path).read_bytes()
    assert data[:4] == b":W&B"
    pos, parts = 7, b""
    while pos + 7 <= len(data):
        left = 32768 - pos % 32768
        if left < 7:
            pos += left
            continue
        _crc, length, kind = struct.unpack("<IHB", data[pos:pos + 7])
        if length == 0 and kind == 0:  # zero padding to the block's end
            pos += left
            continue
        chunk, pos = data[pos + 7:pos + 7 + length], pos + 7 + length
        if kind == 1:
            yield chunk
        elif kind == 2:
            parts = chunk
        elif kind == 3:
            parts += chunk
        elif kind == 4:
            yield parts + chunk
            parts = b""


def wandb_history(run_dir: Path) -> dict[int, dict[str, float]]:
    """step → metrics of every offline wandb run under `run_dir/wandb`."""
    from wandb.proto import wandb_internal_pb2

    history: dict[int, dict[str, float]] = {}
    for path in sorted(glob.glob(str(run_dir / "wandb" / "offline-run-*" / "*.wandb"))):
        for raw in _wandb_records(path):
            record = wandb_internal_pb2.Record()
            record.ParseFromString(raw)
            if record.WhichOneof("record_type") != "history":
                continue
            items = {item.key or "/".join(item.nested_key): float(item.value_json)
                     for item in record.history.item}
            step = int(items.pop("_step"))
            history[step] = {k: v for k, v in items.items() if not k.startswith("_")}
    return history


def settled_wandb_history(run_dir: Path, *, last_step: int,
                          timeout_s: float = 30.0) -> dict[int, dict[str, float]]:
    """`wandb_history` once `last_step` is on disk: a CI run under load read the offline file
    one record short, most likely wandb's service process still writing after `finish()`."""
    deadline = time.monotonic() + timeout_s
    history = wandb_history(run_dir)
    while last_step not in history and time.monotonic() < deadline:
        time.sleep(0.2)
        history = wandb_history(run_dir)
    return history


def test_wandb_without_a_login_logs_offline_and_a_resume_continues_the_run(
    tmp_path: Path, no_login: None
) -> None:
    run_dir = tmp_path / "run"
    with tracked(run_dir, "wandb", "exp/a") as writer:
        for step in range(3):
            writer.write(step, {"loss": 1.0 / (step + 1), "reward/accuracy": 0.1 * step})
        writer.write(2, {"loss": 9.0})  # a step wandb has seen: not sent twice
    run_id = (run_dir / ".wandb-run-id").read_text().strip()
    assert len(glob.glob(str(run_dir / "wandb" / f"offline-run-*-{run_id}"))) == 1
    with tracked(run_dir, "wandb", "exp/a", resume_step=3) as writer:
        writer.write(3, {"loss": 0.25, "reward/accuracy": 0.3})
    assert (run_dir / ".wandb-run-id").read_text().strip() == run_id
    history = settled_wandb_history(run_dir, last_step=3)
    assert sorted(history) == [0, 1, 2, 3]
    assert history[2] == {"loss": pytest.approx(1 / 3), "reward/accuracy": pytest.approx(0.2)}
    assert history[3]["loss"] == 0.25
    assert all(run_id in path for path in glob.glob(str(run_dir / "wandb" / "offline-run-*")))


def test_mlflow_logs_metrics_and_params_to_a_local_file_store(
    tmp_path: Path, no_login: None
) -> None:
    from mlflow.tracking import MlflowClient

    run_dir = tmp_path / "run"
    with tracked(run_dir, "mlflow", "exp/b") as writer:
        for step in range(3):
            writer.write(step, {"loss": 1.0 / (step + 1), "time/step": float("nan")})
    run_id = (run_dir / ".mlflow-run-id").read_text().strip()
    client = MlflowClient(tracking_uri=(run_dir / "mlruns").resolve().as_uri())
    run = client.get_run(run_id)
    assert run.info.status == "FINISHED" and run.info.run_name == "exp/b"
    assert run.data.params == {"algorithm.lr": "0.001", "run.steps": "3", "model.dir": "None"}
    history = client.get_metric_history(run_id, "loss")
    assert [(m.step, m.value) for m in history] == [(0, 1.0), (1, 0.5), (2, pytest.approx(1 / 3))]
    assert "time/step" not in run.data.metrics  # non-finite values are not sent
    with tracked(run_dir, "mlflow", "exp/b", resume_step=3) as writer:
        writer.write(3, {"loss": 0.25})
    assert [m.step for m in client.get_metric_history(run_id, "loss")] == [0, 1, 2, 3]
    assert client.get_run(run_id).info.status == "FINISHED"
    assert len(client.search_runs([run.info.experiment_id])) == 1  # the same run, resumed


def test_an_unknown_tracker_is_refused_and_opened_ones_are_closed(tmp_path: Path,
                                                                  no_login: None) -> None:
    with pytest.raises(ConfigError, match="unknown tracker 'neptune'"):
        open_tracker("neptune", tmp_path, run_name="x", config={})
    with pytest.raises(ConfigError, match="unknown tracker 'neptune'"):
        MetricsWriter(tmp_path / "run", tensorboard=False, trackers=["mlflow", "neptune"])
    from mlflow.tracking import MlflowClient

    client = MlflowClient(tracking_uri=(tmp_path / "run" / "mlruns").resolve().as_uri())
    run_id = (tmp_path / "run" / ".mlflow-run-id").read_text().strip()
    assert client.get_run(run_id).info.status == "FINISHED"  # closed, not left running
