"""Tests of the TCP transport between two processes on loopback."""

from __future__ import annotations

import subprocess
import sys
import textwrap

import numpy as np
import pyarrow as pa
import torch

from rlinf.comm._internal import wire
from rlinf.comm._internal.transports import TcpTransport

_SENDER = textwrap.dedent("""
    import sys
    import numpy as np, torch
    from rlinf.comm import Batch
    from rlinf.comm._internal import wire
    from rlinf.comm._internal.transports import TcpTransport
    port, token = int(sys.argv[1]), bytes.fromhex(sys.argv[2])
    with wire.connect(("127.0.0.1", port), token=token, timeout=30) as conn:
        rng = np.random.default_rng(7)
        batch = Batch({"obs": rng.standard_normal((256, 1024)).astype(np.float32),
                       "mask": np.arange(300) % 3 == 0,
                       "logp": torch.arange(64, dtype=torch.bfloat16).reshape(8, 8).t()},
                      {"episode": 12, "tags": ["a", "b"]})
        exported = TcpTransport().export(batch)
        conn.send({"d": exported.descriptor}, exported.buffers, timeout=30)
        header, _ = conn.recv(timeout=30)
        assert header == {"ok": True}, header
""")


def test_batch_over_loopback_between_processes():
    token = wire.new_token()
    with wire.Listener(token=token) as listener:
        proc = subprocess.Popen([sys.executable, "-c", _SENDER, str(listener.address[1]),
                                 token.hex()])
        try:
            with listener.accept(timeout=60) as conn:
                header, buffers = conn.recv(timeout=60)
                released: list[dict] = []
                batch = TcpTransport().open(header["d"], buffers, on_release=released.append)
                assert released == [header["d"]]  # the owner holds nothing
                rng = np.random.default_rng(7)
                expected = rng.standard_normal((256, 1024)).astype(np.float32)
                assert np.array_equal(batch["obs"], expected)
                assert np.array_equal(batch["mask"], np.arange(300) % 3 == 0)
                logp = torch.arange(64, dtype=torch.bfloat16).reshape(8, 8).t()
                assert isinstance(batch["logp"], torch.Tensor)
                assert torch.equal(batch["logp"], logp)
                assert batch.meta == {"episode": 12, "tags": ["a", "b"]}
                # Zero-copy on arrival: the arrays live in the frame's receive buffer.
                frame = np.frombuffer(buffers[0], dtype=np.uint8)
                assert np.shares_memory(batch["obs"], frame)
                assert np.shares_memory(batch["logp"].view(torch.int16).numpy(), frame)
                conn.send({"ok": True}, timeout=30)
        finally:
            assert proc.wait(timeout=60) == 0


def test_export_is_one_arrow_buffer():
    exported = TcpTransport().export({"x": np.zeros(5)})
    assert len(exported.buffers) == 1
    assert isinstance(exported.buffers[0], pa.Buffer)
    assert exported.descriptor == {"transport": "tcp", "nbytes": exported.buffers[0].size}
