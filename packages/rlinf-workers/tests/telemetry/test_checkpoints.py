from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from rlinf.workers.errors import ConfigError
from rlinf.workers.telemetry import CheckpointStore


def _payload(text: str):  # type: ignore[no-untyped-def]
    def write(d: Path) -> None:
        (d / "weights.bin").write_text(text)
        (d / "sub").mkdir()
        (d / "sub" / "optim.bin").write_text(text * 2)

    return write


def test_save_then_latest_returns_step_path_and_meta(tmp_path: Path) -> None:
    store = CheckpointStore(tmp_path)
    assert store.latest() is None
    path = store.save(42, _payload("a"), meta={"epoch": 3, "seed": [1, 2]})
    assert path == tmp_path / "step-00000042"
    step, got, meta = store.latest()  # type: ignore[misc]
    assert (step, got, meta) == (42, path, {"epoch": 3, "seed": [1, 2]})
    assert (got / "sub" / "optim.bin").read_text() == "aa"
    assert (tmp_path / "LATEST").read_text().strip() == "step-00000042"
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".tmp")]


def test_keep_prunes_older_checkpoints(tmp_path: Path) -> None:
    store = CheckpointStore(tmp_path, keep=2)
    for s in (1, 2, 3, 4):
        store.save(s, _payload(str(s)), meta={})
    assert [s for s, _ in store.steps()] == [3, 4]
    assert store.latest()[0] == 4  # type: ignore[index]


def test_resaving_a_step_replaces_it(tmp_path: Path) -> None:
    store = CheckpointStore(tmp_path)
    store.save(5, _payload("old"), meta={"v": 1})
    store.save(5, _payload("new"), meta={"v": 2})
    step, path, meta = store.latest()  # type: ignore[misc]
    assert step == 5 and meta == {"v": 2} and (path / "weights.bin").read_text() == "new"


def test_latest_falls_back_when_pointer_missing_or_corrupt(tmp_path: Path) -> None:
    store = CheckpointStore(tmp_path, keep=3)
    store.save(1, _payload("1"), meta={"n": 1})
    store.save(2, _payload("2"), meta={"n": 2})
    (tmp_path / "LATEST").write_text("garbage")
    assert store.latest()[0] == 2  # type: ignore[index]
    (tmp_path / "LATEST").unlink()
    assert store.latest()[0] == 2  # type: ignore[index]
    (tmp_path / "LATEST").write_text("step-00000002\n")
    (tmp_path / "step-00000002" / "meta.json").write_text("{torn")
    assert store.latest()[:1] == (1,)  # type: ignore[index]
    (tmp_path / ".tmp-step-00000003-xyz").mkdir()  # an interrupted save is never returned
    assert store.latest()[0] == 1  # type: ignore[index]


def test_failed_write_leaves_previous_checkpoint_and_no_temp(tmp_path: Path) -> None:
    store = CheckpointStore(tmp_path)
    store.save(1, _payload("1"), meta={})

    def broken(d: Path) -> None:
        (d / "half").write_text("x")
        raise OSError("disk full")

    with pytest.raises(OSError, match="disk full"):
        store.save(2, broken, meta={})
    assert store.latest()[0] == 1  # type: ignore[index]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["LATEST", "step-00000001"]


def test_bad_arguments_are_config_errors(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="keep"):
        CheckpointStore(tmp_path, keep=0)
    store = CheckpointStore(tmp_path)
    with pytest.raises(ConfigError, match="JSON"):
        store.save(1, _payload("x"), meta={"obj": object()})
    with pytest.raises(ConfigError, match="step"):
        store.save(-1, _payload("x"), meta={})
    with pytest.raises(ConfigError, match="reserved"):
        store.save(1, lambda d: (d / "meta.json").write_text("{}"), meta={})
    assert store.latest() is None


_KILLED_SAVER = textwrap.dedent("""
    import sys, time
    from pathlib import Path
    from rlinf.workers.telemetry import CheckpointStore

    store = CheckpointStore(Path(sys.argv[1]), keep=2)
    store.save(1, lambda d: (d / "w.bin").write_bytes(b"1" * 1000), meta={"step": 1})

    def slow(d: Path) -> None:
        (d / "w.bin").write_bytes(b"2" * 500)
        print("writing", flush=True)
        time.sleep(60)

    store.save(2, slow, meta={"step": 2})
""")


def test_sigkill_during_save_keeps_previous_checkpoint(tmp_path: Path) -> None:
    proc = subprocess.Popen([sys.executable, "-c", _KILLED_SAVER, str(tmp_path)],
                            stdout=subprocess.PIPE, text=True)
    try:
        assert proc.stdout is not None
        for line in proc.stdout:  # structlog's default logger also prints to stdout
            if line.strip() == "writing":
                break
        os.kill(proc.pid, signal.SIGKILL)
    finally:
        if proc.poll() is None:
            proc.kill()
        proc.wait(timeout=30)
        if proc.stdout is not None:
            proc.stdout.close()
    assert proc.returncode == -signal.SIGKILL
    assert any(p.name.startswith(".tmp-step-00000002") for p in tmp_path.iterdir())
    store = CheckpointStore(tmp_path, keep=2)
    step, path, meta = store.latest()  # type: ignore[misc]
    assert (step, meta) == (1, {"step": 1})
    assert (path / "w.bin").read_bytes() == b"1" * 1000
    store.save(2, lambda d: (d / "w.bin").write_bytes(b"2"), meta={"step": 2})
    assert store.latest()[0] == 2  # type: ignore[index]
    assert not any(p.name.startswith(".tmp") for p in tmp_path.iterdir())
