"""Tests of the shared-memory transport, within a process and across two."""

from __future__ import annotations

import gc
import json
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest
import torch

from rlinf.comm import Batch, TransportError
from rlinf.comm._internal import shm
from rlinf.comm._internal.transports import SharedMemoryTransport

SHM = Path("/dev/shm")


@pytest.fixture
def owner():
    pool = shm.SegmentPool()
    transport = SharedMemoryTransport(pool=pool)
    yield transport
    transport.close()
    pool.close()


def test_round_trip_keeps_kinds_and_metadata(owner):
    reader = SharedMemoryTransport(reader=shm.SegmentReader())
    batch = Batch({"ids": np.arange(10, dtype=np.int64),
                   "w": torch.ones(2, 3, dtype=torch.bfloat16),
                   "t": np.arange(12.0).reshape(3, 4).T}, {"step": 3})
    exported = owner.export(batch)
    assert exported.buffers == []
    assert json.loads(json.dumps(exported.descriptor)) == exported.descriptor
    got = reader.open(exported.descriptor, [])
    assert got.meta == {"step": 3}
    assert isinstance(got["ids"], np.ndarray) and np.array_equal(got["ids"], batch["ids"])
    assert isinstance(got["w"], torch.Tensor) and torch.equal(got["w"], batch["w"])
    assert np.array_equal(got["t"], batch["t"])


def test_release_fires_after_views_die_and_the_segment_is_reused(owner):
    reader = SharedMemoryTransport(reader=shm.SegmentReader())
    released: list[dict] = []
    first = owner.export({"x": np.arange(1000)})
    got = reader.open(first.descriptor, [], on_release=released.append)
    x = got["x"]
    del got
    gc.collect()
    assert released == []
    del x
    assert released == [first.descriptor]
    owner.release(first.descriptor)
    second = owner.export({"x": np.arange(1000) * 2})
    assert second.descriptor["name"] == first.descriptor["name"]  # pooled, warm
    assert owner.pool.created == 1
    assert np.array_equal(reader.open(second.descriptor, [])["x"], np.arange(1000) * 2)
    with pytest.raises(TransportError, match="exported"):
        owner.release(first.descriptor | {"name": "rlinf-" + "f" * 32})


_OWNER = textwrap.dedent("""
    import json, sys
    import numpy as np
    from rlinf.comm._internal.transports import SharedMemoryTransport
    t = SharedMemoryTransport()
    def send(scale):
        exported = t.export({"x": np.arange(1 << 20, dtype=np.float32) * scale})
        print("DESC", json.dumps(exported.descriptor), flush=True)
        return exported.descriptor
    desc = send(1)
    for line in sys.stdin:
        if line.strip() == "release":
            t.release(desc)
            desc = send(2)
        else:
            break
""")


def _next_descriptor(proc: subprocess.Popen[str]) -> dict:
    assert proc.stdout is not None
    for line in proc.stdout:
        if line.startswith("DESC "):
            return json.loads(line[5:])
    raise AssertionError(f"owner exited early with {proc.wait(timeout=30)}")


def test_across_processes_zero_copy_with_cached_mapping():
    proc = subprocess.Popen([sys.executable, "-c", _OWNER], stdin=subprocess.PIPE,
                            stdout=subprocess.PIPE, text=True)
    assert proc.stdin is not None
    reader_shm = shm.SegmentReader()
    reader = SharedMemoryTransport(reader=reader_shm)
    try:
        desc = _next_descriptor(proc)
        released: list[dict] = []
        x = reader.open(desc, [], on_release=released.append)["x"]
        assert x[12345] == 12345.0
        mapping = np.frombuffer(reader_shm._maps[desc["name"]], dtype=np.uint8)
        assert np.shares_memory(x, mapping)  # a view on the owner's segment, not a copy
        del x, mapping
        assert released == [desc]
        proc.stdin.write("release\n")
        proc.stdin.flush()
        again = _next_descriptor(proc)
        assert again["name"] == desc["name"]
        maps_before = list(reader_shm._maps)
        y = reader.open(again, [])["x"]
        assert y[12345] == 24690.0
        assert list(reader_shm._maps) == maps_before  # no new mapping
        del y
    finally:
        proc.stdin.write("exit\n")
        proc.stdin.flush()
        assert proc.wait(timeout=30) == 0
    assert not (SHM / desc["name"]).exists()
