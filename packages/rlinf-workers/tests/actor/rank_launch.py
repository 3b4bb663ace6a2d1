"""Two-rank gloo runs of a training script (dist_train.py, megatron/megatron_train.py): the
test side starts the ranks and loads what they saved; the script side joins the group.

Script command line: ``RANK WORLD_SIZE PORT MODE[,MODE...] OUT_DIR``; each rank saves
``OUT_DIR/{mode}-rank{R}.pt`` per mode.
"""

from __future__ import annotations

import os
import socket
import subprocess
import sys
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist


def launch(script: Path, modes: list[str], out: Path, *, world: int = 2,
           timeout: float = 300, env: dict[str, str] | None = None
           ) -> dict[str, list[dict[str, Any]]]:
    """Run `script` on `world` ranks for every mode at once (starting Python is the slow
    part); fails with a rank's output if it fails. Returns each mode's saved results by rank."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = int(s.getsockname()[1])
    procs = [subprocess.Popen([sys.executable, str(script), str(rank), str(world), str(port),
                               ",".join(modes), str(out)],
                              stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                              env=None if env is None else {**os.environ, **env})
             for rank in range(world)]
    logs = [p.communicate(timeout=timeout)[0] for p in procs]
    for proc, log in zip(procs, logs, strict=True):
        assert proc.returncode == 0, log[-3000:]
    return {mode: [torch.load(out / f"{mode}-rank{r}.pt") for r in range(world)]
            for mode in modes}


def join(backend: str = "gloo") -> tuple[int, int, list[str], str]:
    """Script side: join the group of the command line; (rank, world, modes, out)."""
    rank, world, port = int(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3])
    torch.manual_seed(0)
    if backend == "nccl":
        torch.cuda.set_device(rank)
    dist.init_process_group(backend, init_method=f"tcp://127.0.0.1:{port}", rank=rank,
                            world_size=world)
    return rank, world, sys.argv[4].split(","), sys.argv[5]
