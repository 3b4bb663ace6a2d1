"""Tests of the in-process transport."""

from __future__ import annotations

import numpy as np
import pytest

from rlinf.comm import Batch, TransportError
from rlinf.comm._internal.transports import InProcessTransport


def test_hands_over_the_same_objects_and_releases():
    transport = InProcessTransport()
    batch = Batch({"x": np.arange(4)}, {"step": 1})
    exported = transport.export(batch)
    assert exported.buffers == []
    released = []
    got = transport.open(exported.descriptor, [], on_release=released.append)
    assert got is batch and got["x"] is batch["x"]
    assert released == [exported.descriptor]
    assert transport.held == 1
    # Opening again works until the owner releases (a local re-open is legitimate).
    assert transport.open(exported.descriptor, []) is batch
    transport.release(exported.descriptor)
    assert transport.held == 0
    with pytest.raises(TransportError, match="released"):
        transport.open(exported.descriptor, [])


def test_refuses_descriptors_of_another_process():
    transport = InProcessTransport()
    desc = dict(transport.export(Batch({})).descriptor, pid=-5)
    with pytest.raises(TransportError, match="pid"):
        transport.open(desc, [])
