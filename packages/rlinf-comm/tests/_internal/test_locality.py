"""Tests of rlinf.comm._internal.locality."""

from __future__ import annotations

import json
import os
import subprocess
import sys

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
