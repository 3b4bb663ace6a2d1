"""CUDA IPC between two processes on one GPU (skipped without a CUDA GPU)."""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
import textwrap

import pytest

from rlinf.comm._internal.transports import CudaIpcTransport


def _cuda() -> bool:
    try:
        import torch
    except ImportError:
        return False
    return bool(torch.cuda.is_available())


pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not _cuda(), reason="needs a CUDA GPU")]

_OWNER = textwrap.dedent("""
    import json, sys
    import numpy as np, torch
    from rlinf.comm._internal.transports import CudaIpcTransport
    kind = sys.argv[1]
    if kind == "torch":
        x = torch.arange(1 << 20, dtype=torch.float32, device="cuda")
        w = torch.ones(64, 32, dtype=torch.bfloat16, device="cuda").t()  # strided view
        read = lambda: float(x[7].item())
    else:
        import cupy
        x = cupy.arange(1 << 20, dtype=cupy.float32)
        w = cupy.ones((64, 32), dtype=cupy.float16).T
        read = lambda: float(x[7].get())
    t = CudaIpcTransport()
    exported = t.export({"x": x, "w": w, "host": np.arange(5)})
    print("DESC", json.dumps(exported.descriptor), flush=True)
    assert sys.stdin.readline().strip() == "check"
    print("SEEN", read(), flush=True)  # the receiver wrote through its mapping
    assert sys.stdin.readline().strip() == "release"
    t.release(exported.descriptor)
""")


def _line(proc: subprocess.Popen[str], tag: str) -> str:
    assert proc.stdout is not None
    for line in proc.stdout:
        if line.startswith(tag + " "):
            return line[len(tag) + 1:].strip()
    raise AssertionError(f"owner exited early with {proc.wait(timeout=60)}")


def _tell(proc: subprocess.Popen[str], word: str) -> None:
    assert proc.stdin is not None
    proc.stdin.write(word + "\n")
    proc.stdin.flush()


@pytest.mark.parametrize("kind", ["torch", "cupy"])
def test_gpu_batch_between_two_processes_shares_device_memory(kind):
    if kind == "cupy" and importlib.util.find_spec("cupy") is None:
        pytest.skip("needs cupy (rlinf-comm[cuda])")
    import numpy as np
    import torch

    proc = subprocess.Popen([sys.executable, "-c", _OWNER, kind], stdin=subprocess.PIPE,
                            stdout=subprocess.PIPE, text=True)
    try:
        desc = json.loads(_line(proc, "DESC"))
        released: list[dict] = []
        batch = CudaIpcTransport().open(desc, [], on_release=released.append)
        x, w = batch["x"], batch["w"]
        if kind == "torch":
            assert x.is_cuda and x.dtype == torch.float32
            assert float(x[123].item()) == 123.0
            assert tuple(w.shape) == (32, 64) and w.dtype == torch.bfloat16
            assert bool((w == 1).all())
            x[7] = -1.0
            torch.cuda.synchronize()
        else:
            import cupy

            assert isinstance(x, cupy.ndarray) and float(x[123].get()) == 123.0
            assert w.shape == (32, 64) and bool((w == 1).all())
            x[7] = -1.0
            cupy.cuda.get_current_stream().synchronize()
        assert np.array_equal(np.asarray(batch["host"]), np.arange(5))
        _tell(proc, "check")
        assert float(_line(proc, "SEEN")) == -1.0  # same memory, not a copy
        del batch, x, w
        import gc

        gc.collect()
        assert released == [desc]
        _tell(proc, "release")
        assert proc.wait(timeout=60) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
