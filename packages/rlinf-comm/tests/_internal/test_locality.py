"""Tests of rlinf.comm._internal.locality."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import types

import numpy as np

from rlinf.comm._internal.locality import Locality, local_gpu_uuids


def test_current_locality_round_trips_through_json():
    here = Locality.current()
    assert here.pid == os.getpid()
    assert here.host_id
    again = Locality.from_dict(json.loads(json.dumps(here.to_dict())))
    assert again == here
    assert here.same_process(again)


def test_two_processes_share_a_node_but_not_a_process():
    out = subprocess.run(
        [sys.executable, "-c", "import json; from rlinf.comm._internal.locality import "
         "Locality; print('LOC', json.dumps(Locality.current().to_dict()))"],
        capture_output=True, text=True, check=True, timeout=60).stdout
    line = next(x for x in out.splitlines() if x.startswith("LOC "))
    other = Locality.from_dict(json.loads(line[4:]))
    here = Locality.current()
    assert here.same_node(other)
    assert not here.same_process(other)
    assert here.elsewhere_on_node().same_node(here)
    assert not here.elsewhere_on_node().same_process(here)


def test_hidden_gpus_are_not_reported(monkeypatch):
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "")
    assert local_gpu_uuids() == ()
    assert Locality.current(probe_gpus=False).gpu_uuids == ()


def test_other_hosts_differ():
    here = Locality.current(probe_gpus=False)
    far = Locality("elsewhere/boot", here.pid)
    assert not here.same_node(far)
    assert not here.same_process(far)


def test_explicit_node_identity_splits_one_host_into_nodes(monkeypatch):
    from rlinf.comm._internal.locality import NODE_ID_ENV
    from rlinf.comm._internal.transports import select_transport

    monkeypatch.setenv(NODE_ID_ENV, "node-a")
    a = Locality.current(probe_gpus=False)
    monkeypatch.setenv(NODE_ID_ENV, "node-b")
    b = Locality.current(probe_gpus=False)
    monkeypatch.setenv(NODE_ID_ENV, "node-a")
    assert a.host_id.endswith("/node:node-a")
    assert not a.same_node(b)
    assert a.same_node(Locality.current(probe_gpus=False))
    batch = {"x": np.zeros(4)}
    assert select_transport(a, Locality(b.host_id, 1), batch) == "tcp"
    assert select_transport(a, Locality(a.host_id, 1), batch) == "shm"


class _FakeRay:
    """Stands in for a connected `ray` module: only what node_identity reads."""

    def __init__(self, node_id, initialized=True, ip="127.0.0.1"):
        self._node_id, self._initialized = node_id, initialized
        self.util = types.SimpleNamespace(get_node_ip_address=lambda: ip)

    def is_initialized(self):
        return self._initialized

    def get_runtime_context(self):
        return types.SimpleNamespace(get_node_id=lambda: self._node_id)


def test_ray_node_id_is_part_of_the_host_id_when_connected(monkeypatch):
    from rlinf.comm._internal.locality import NODE_ID_ENV, node_identity

    monkeypatch.delenv(NODE_ID_ENV, raising=False)
    monkeypatch.setitem(sys.modules, "ray", _FakeRay("aa11", initialized=False))
    plain = Locality.current(probe_gpus=False)
    assert node_identity() == "" and "/node:" not in plain.host_id
    monkeypatch.setitem(sys.modules, "ray", _FakeRay("aa11"))
    head = Locality.current(probe_gpus=False)
    monkeypatch.setitem(sys.modules, "ray", _FakeRay("bb22"))
    worker = Locality.current(probe_gpus=False)
    assert head.host_id == plain.host_id + "/node:aa11"
    assert not head.same_node(worker)
    monkeypatch.setenv(NODE_ID_ENV, "explicit")  # the explicit identity wins over Ray's
    assert node_identity() == "explicit"


def test_endpoints_listen_where_other_nodes_reach_them(monkeypatch, store):
    from rlinf.comm import Endpoint, EndpointConfig
    from rlinf.comm._internal.locality import HOST_ENV, default_listen_host

    monkeypatch.delenv(HOST_ENV, raising=False)
    monkeypatch.delitem(sys.modules, "ray", raising=False)
    assert default_listen_host() == "127.0.0.1"  # no Ray, no setting: loopback
    monkeypatch.setitem(sys.modules, "ray", _FakeRay("aa11", ip="10.1.2.3"))
    assert default_listen_host() == "10.1.2.3"  # connected to Ray: the node's own IP
    monkeypatch.setitem(sys.modules, "ray", _FakeRay("aa11", initialized=False, ip="10.1.2.3"))
    assert default_listen_host() == "127.0.0.1"
    monkeypatch.setenv(HOST_ENV, "127.0.0.1")  # the setting wins
    with Endpoint("listen-default", store=store) as ep:
        assert ep.config.host == "127.0.0.1" and ep.address[0] == "127.0.0.1"
    with Endpoint("listen-explicit", store=store,
                  config=EndpointConfig(host="localhost")) as ep:
        assert ep.config.host == "localhost"
