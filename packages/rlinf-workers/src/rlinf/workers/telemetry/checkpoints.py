"""Atomic, pruned checkpoint directories: ``root/step-00000042`` plus a ``LATEST`` pointer.

A save fills a temporary directory inside `root` (same file system), fsyncs every file,
then renames it onto ``step-%08d`` in one `os.replace`, and rewrites ``LATEST`` through a
temporary file and `os.replace` as well. A process killed at any point leaves either the
previous complete checkpoint or the new one, never a half-written ``step-*`` directory:
`latest()` ignores temporary directories and falls back to the newest complete step
directory when ``LATEST`` is missing, corrupt or points at nothing.

One process writes to a root at a time (the driver); any number may read.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import tempfile
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import structlog

from rlinf.workers.errors import ConfigError

__all__ = ["LATEST_FILE", "META_FILE", "CheckpointStore"]

LATEST_FILE = "LATEST"
"""Name of the pointer file holding the latest step directory's name."""
META_FILE = "meta.json"
"""Name of the JSON file holding a checkpoint's `meta`, beside the payload; reserved."""

_STEP_RE = re.compile(r"^step-(\d{8,})$")
_TMP_PREFIX = ".tmp-"
log = structlog.get_logger(__name__)


def _fsync_path(path: Path, *, directory: bool = False) -> None:
    fd = os.open(path, os.O_RDONLY | (os.O_DIRECTORY if directory else 0))
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _fsync_tree(root: Path) -> None:
    for dirpath, _dirnames, filenames in os.walk(root):
        for name in filenames:
            p = Path(dirpath, name)
            if not p.is_symlink():
                _fsync_path(p)
        _fsync_path(Path(dirpath), directory=True)


class CheckpointStore:
    """Checkpoints under `root`, one directory per step; the newest `keep` are kept.

    Args:
        root: directory holding the checkpoints (created if missing).
        keep: how many complete checkpoints to keep; older ones are deleted after each save.
    """

    def __init__(self, root: Path, *, keep: int = 2) -> None:
        if isinstance(keep, bool) or not isinstance(keep, int) or keep < 1:
            raise ConfigError(f"CheckpointStore keep={keep!r}: expected an int >= 1")
        self.root = Path(root)
        self.keep = keep
        self.root.mkdir(parents=True, exist_ok=True)

    def path_for(self, step: int) -> Path:
        """The directory a checkpoint of `step` lives in."""
        return self.root / f"step-{step:08d}"

    def save(
        self, step: int, write: Callable[[Path], object], *, meta: Mapping[str, Any]
    ) -> Path:
        """Write the checkpoint of `step` and make it the latest; returns its directory.

        `write(tmp_dir)` fills a fresh temporary directory with the payload (any files and
        subdirectories except ``meta.json``); `meta` (JSON-serializable: step counters,
        config, RNG seeds) is stored as ``meta.json`` beside it and returned by `latest()`.
        Saving a step that already exists replaces it.
        """
        if isinstance(step, bool) or not isinstance(step, int) or step < 0:
            raise ConfigError(f"checkpoint step={step!r}: expected an int >= 0")
        try:
            meta_text = json.dumps(dict(meta), indent=2, sort_keys=True)
        except (TypeError, ValueError) as exc:
            raise ConfigError(f"checkpoint meta for step {step} is not JSON-serializable "
                              f"({exc}); pass plain numbers, strings, lists and dicts") from exc
        self._remove_stale_temps()
        tmp = Path(tempfile.mkdtemp(prefix=f"{_TMP_PREFIX}step-{step:08d}-", dir=self.root))
        try:
            write(tmp)
            meta_path = tmp / META_FILE
            if meta_path.exists():
                raise ConfigError(f"the checkpoint writer created {META_FILE!r}, which is "
                                  "reserved for `meta`; pass that data as meta= instead")
            meta_path.write_text(meta_text, encoding="utf-8")
            _fsync_tree(tmp)
            final = self.path_for(step)
            if final.exists():  # redoing a step after a resume: move the old one aside first
                trash = Path(tempfile.mkdtemp(prefix=f"{_TMP_PREFIX}old-", dir=self.root))
                os.replace(final, trash / final.name)
                os.replace(tmp, final)
                shutil.rmtree(trash, ignore_errors=True)
            else:
                os.replace(tmp, final)
            _fsync_path(self.root, directory=True)
        except BaseException:
            shutil.rmtree(tmp, ignore_errors=True)
            raise
        self._write_latest(final.name)
        self._prune(keep_also=final)
        log.info("checkpoint_saved", step=step, path=str(final))
        return final

    def latest(self) -> tuple[int, Path, dict[str, Any]] | None:
        """``(step, directory, meta)`` of the latest complete checkpoint, or None if none."""
        pointer = self.root / LATEST_FILE
        try:
            name = pointer.read_text(encoding="utf-8").strip()
        except OSError:
            name = ""
        match = _STEP_RE.match(name)
        if match:
            found = self._load(int(match.group(1)), self.root / name)
            if found is not None:
                return found
            log.warning("checkpoint_latest_invalid", pointer=name, root=str(self.root))
        for step, path in reversed(self.steps()):
            found = self._load(step, path)
            if found is not None:
                return found
        return None

    def steps(self) -> list[tuple[int, Path]]:
        """Every complete checkpoint as ``(step, directory)``, oldest step first."""
        out = []
        for p in self.root.iterdir() if self.root.exists() else ():
            match = _STEP_RE.match(p.name)
            if match and p.is_dir():
                out.append((int(match.group(1)), p))
        return sorted(out)

    @staticmethod
    def _load(step: int, path: Path) -> tuple[int, Path, dict[str, Any]] | None:
        try:
            meta = json.loads((path / META_FILE).read_text(encoding="utf-8"))
        except (OSError, json.JSONDecodeError):
            return None
        return (step, path, meta) if isinstance(meta, dict) else None

    def _write_latest(self, name: str) -> None:
        fd, tmp = tempfile.mkstemp(prefix=f"{_TMP_PREFIX}latest-", dir=self.root)
        try:
            with os.fdopen(fd, "w", encoding="utf-8") as f:
                f.write(name + "\n")
                f.flush()
                os.fsync(f.fileno())
            os.replace(tmp, self.root / LATEST_FILE)
        except BaseException:
            Path(tmp).unlink(missing_ok=True)
            raise
        _fsync_path(self.root, directory=True)

    def _prune(self, *, keep_also: Path) -> None:
        steps = self.steps()
        for _step, path in steps[: max(0, len(steps) - self.keep)]:
            if path != keep_also:
                shutil.rmtree(path, ignore_errors=True)
                log.debug("checkpoint_pruned", path=str(path))

    def _remove_stale_temps(self) -> None:
        """Delete what an interrupted save left behind (this root has one writer)."""
        for p in self.root.iterdir():
            if p.name.startswith(_TMP_PREFIX):
                if p.is_dir():
                    shutil.rmtree(p, ignore_errors=True)
                else:
                    p.unlink(missing_ok=True)
