"""Tests of transport selection, the registry, and missing-extra errors."""

from __future__ import annotations

import numpy as np
import pytest

from rlinf.comm import Batch, MissingExtraError, TransportError
from rlinf.comm._internal import transports as tp
from rlinf.comm._internal.transports import gpu

HERE = tp.Locality("node-a/boot", 100)
SIBLING = tp.Locality("node-a/boot", 200)
FAR = tp.Locality("node-b/boot", 100)
HOST_BATCH = Batch({"x": np.zeros(3)})


def test_host_batches_pick_by_locality():
    assert tp.select_transport(HERE, HERE, HOST_BATCH) == "inproc"
    assert tp.select_transport(HERE, SIBLING, HOST_BATCH) == "shm"
    assert tp.select_transport(HERE, FAR, HOST_BATCH) == "tcp"
    assert tp.select_transport(HERE, FAR, {"x": np.zeros(1)}) == "tcp"


def test_device_batches_pick_gpu_transports(monkeypatch):
    # No GPU here: mark the batch as device-resident to exercise the rule itself.
    monkeypatch.setattr(Batch, "on_device", property(lambda self: True))
    assert tp.select_transport(HERE, HERE, HOST_BATCH) == "inproc"
    assert tp.select_transport(HERE, SIBLING, HOST_BATCH) == "cuda_ipc"
    assert tp.select_transport(HERE, FAR, HOST_BATCH) == "nccl"


def test_override_wins_and_is_validated():
    assert tp.select_transport(HERE, FAR, HOST_BATCH, override="shm") == "shm"
    with pytest.raises(TransportError, match="among"):
        tp.select_transport(HERE, FAR, HOST_BATCH, override="carrier-pigeon")


def test_get_transport_returns_one_instance_per_name():
    for name in tp.TRANSPORT_TYPES:
        first = tp.get_transport(name)
        assert first is tp.get_transport(name)
        assert first.name == name
    with pytest.raises(TransportError):
        tp.get_transport("nope")


def test_descriptors_of_another_transport_are_refused():
    with pytest.raises(TransportError, match="expected a 'tcp' descriptor"):
        tp.get_transport("tcp").open({"transport": "shm"}, [])


def _has(module: str) -> bool:
    import importlib.util

    return importlib.util.find_spec(module) is not None


@pytest.mark.skipif(_has("cupy"), reason="cupy is installed here")
def test_gpu_transports_name_the_missing_extra():
    with pytest.raises(MissingExtraError, match=r"rlinf-comm\[cuda\]"):
        gpu.cupy_module("the NCCL transport")
    nccl = tp.NcclTransport(store=None, self_id="a")
    with pytest.raises(MissingExtraError, match=r"rlinf-comm\[cuda\]"):
        nccl.export(HOST_BATCH, peer="b")


def test_nccl_needs_configuration_and_a_peer():
    nccl = tp.NcclTransport()
    with pytest.raises(TransportError, match="peer"):
        nccl.export(HOST_BATCH)
    with pytest.raises(TransportError, match="configure"):
        _ = nccl.store
