"""NCCL send/recv between two processes on two GPUs (skipped with fewer than two)."""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
import textwrap

import pytest


def _gpus() -> int:
    try:
        import torch
    except ImportError:
        return 0
    return torch.cuda.device_count() if torch.cuda.is_available() else 0


pytestmark = [
    pytest.mark.gpu, pytest.mark.multi_gpu,
    pytest.mark.skipif(_gpus() < 2, reason="needs two CUDA GPUs"),
    pytest.mark.skipif(importlib.util.find_spec("cupy") is None,
                       reason="needs cupy (rlinf-comm[cuda])"),
]

_PEER = textwrap.dedent("""
    import json, os, sys, time
    from pathlib import Path
    import numpy as np, torch
    from rlinf.comm._internal.transports import NcclTransport

    class FileStore:
        # A rendezvous store on a shared directory (same node), good enough for a test.
        def __init__(self, root): self.root = Path(root)
        def set(self, key, value):
            path = self.root / key.replace("/", "_")
            tmp = path.with_suffix(".tmp"); tmp.write_bytes(value); tmp.rename(path)
        def get(self, key, *, timeout=None):
            path = self.root / key.replace("/", "_")
            deadline = time.monotonic() + (timeout or 60)
            while not path.exists():
                if time.monotonic() > deadline: raise TimeoutError(key)
                time.sleep(0.01)
            return path.read_bytes()

    role, root = sys.argv[1], sys.argv[2]
    store = FileStore(root)
    t = NcclTransport(timeout=120)
    t.configure(store=store, self_id=role)
    if role == "a":
        batch = {"x": torch.arange(1 << 20, dtype=torch.float32, device="cuda") * 3,
                 "w": torch.ones(16, 8, dtype=torch.bfloat16, device="cuda").t(),
                 "host": np.arange(4)}
        for step in range(3):
            batch["x"] += 1
            exported = t.export(batch, peer="b")
            msg = {"d": exported.descriptor,
                   "b": [bytes(memoryview(b)).hex() for b in exported.buffers]}
            store.set(f"msg/{step}", json.dumps(msg).encode())
            t.drain(timeout=120)
        print("SENT", flush=True)
    else:
        for step in range(3):
            msg = json.loads(store.get(f"msg/{step}", timeout=120))
            buffers = [memoryview(bytearray(bytes.fromhex(h))) for h in msg["b"]]
            got = t.open(msg["d"], buffers)
            x = got["x"]
            want = torch.arange(1 << 20, dtype=torch.float32, device="cuda") * 3 + step + 1
            assert torch.equal(x, want), step
            assert got["w"].shape == (8, 16) and bool((got["w"] == 1).all())
            assert np.array_equal(np.asarray(got["host"]), np.arange(4))
        print("RECEIVED", flush=True)
""")


def test_three_batches_from_gpu0_to_gpu1(tmp_path):
    procs = []
    for role, gpu in (("a", "0"), ("b", "1")):
        env = {**os.environ, "CUDA_VISIBLE_DEVICES": gpu}
        procs.append(subprocess.Popen([sys.executable, "-c", _PEER, role, str(tmp_path)],
                                      env=env, stdout=subprocess.PIPE, text=True))
    outputs = [p.communicate(timeout=300)[0] for p in procs]
    assert [p.returncode for p in procs] == [0, 0], outputs
    assert "SENT" in outputs[0] and "RECEIVED" in outputs[1]
