"""`PeerChannel` between two endpoints of one node: items go through a shared-memory ring
once the producer offered it, keep their order, keys, dtypes and torch-ness, an item too
large for a slot keeps its place, and a killed producer surfaces as `PeerGoneError` naming
it."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import threading
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
import torch

from rlinf.comm import Batch, Endpoint, TCPStore, new_token, token_env_value
from rlinf.workers.flow.peer import PeerChannel, PeerGoneError, PeerTimeoutError

SHM = Path("/dev/shm")


@pytest.fixture
def store(monkeypatch: pytest.MonkeyPatch) -> Iterator[TCPStore]:
    token = new_token()
    monkeypatch.setenv("RLINF_COMM_TOKEN", token_env_value(token))
    # One node for this process and the producers it starts: where an earlier test left Ray
    # initialised here, the Ray node id would otherwise make them look like two nodes
    # (rlinf.comm's node identity), and no ring would join them.
    monkeypatch.setenv("RLINF_NODE_ID", "test-node")
    with TCPStore.serve(token=token, timeout=60) as owner:
        yield owner


def _ends(store: TCPStore, *, shared_memory: bool = True
          ) -> tuple[Endpoint, Endpoint, PeerChannel, PeerChannel]:
    env, policy = Endpoint("run/env/0", store=store), Endpoint("run/policy/0", store=store)
    to_policy = PeerChannel(env, edge="env->policy", peer=policy.name, timeout=30,
                            filed=PeerChannel.mailbox(), shared_memory=shared_memory)
    from_env = PeerChannel(policy, edge="env->policy", peer=env.name, timeout=30,
                           filed=PeerChannel.mailbox(), shared_memory=shared_memory)
    return env, policy, to_policy, from_env


def _items(count: int) -> Iterator[tuple[str, Batch]]:
    for i in range(count):
        key = f"stage{i % 2}"
        tensors = {"obs": np.full((4, 3), i, dtype=np.float32),
                   "done": torch.tensor([i % 3 == 0] * 4),
                   "step": np.int64(i)}
        if i % 50 == 7:  # larger than a 64 KiB slot: over the endpoint, in its place
            tensors["frame"] = np.full((300, 300), i % 251, dtype=np.uint8)
        yield key, Batch(tensors, meta={"i": i})


@pytest.mark.parametrize("shared_memory", [True, False])
def test_items_arrive_per_key_in_order_with_their_types(store: TCPStore,
                                                        shared_memory: bool) -> None:
    env, policy, to_policy, from_env = _ends(store, shared_memory=shared_memory)
    try:
        count = 400
        sent = list(_items(count))
        thread = threading.Thread(target=lambda: [to_policy.put(b, key=k) for k, b in sent])
        thread.start()
        for key in ("stage0", "stage1"):  # all of stage0 first: stage1's items get filed
            for i in range(0 if key == "stage0" else 1, count, 2):
                got = from_env.get(key=key, timeout=30)
                assert got.meta["i"] == i
                assert got["obs"].dtype == np.float32 and np.all(got["obs"] == i)
                assert isinstance(got["done"], torch.Tensor)
                assert got["done"].tolist() == [i % 3 == 0] * 4
                assert int(got["step"]) == i
                if i % 50 == 7:
                    assert got["frame"].shape == (300, 300) and got["frame"][5, 5] == i % 251
        thread.join(timeout=30)
        assert (to_policy._ring is not None) is shared_memory
        assert ("env->policy" in from_env._filed.rings) is shared_memory
        with pytest.raises(PeerTimeoutError, match="none arrived"):
            from_env.get(key="stage0", timeout=0.2)
    finally:
        to_policy.disconnect()
        from_env.disconnect()
        env.close()
        policy.close()


def test_a_killed_producer_is_named_by_the_consumer(store: TCPStore) -> None:
    policy = Endpoint("run/policy/0", store=store)
    from_env = PeerChannel(policy, edge="env->policy", peer="run/env/0", timeout=30,
                           filed=PeerChannel.mailbox())
    code = textwrap.dedent(f"""
        import time, numpy as np
        from rlinf.comm import Batch, Endpoint, TCPStore
        from rlinf.workers.flow.peer import PeerChannel
        store = TCPStore({store.address!r}, timeout=30)
        env = Endpoint("run/env/0", store=store)
        link = PeerChannel(env, edge="env->policy", peer="run/policy/0", timeout=30,
                           filed=PeerChannel.mailbox())
        link.put(Batch({{"obs": np.zeros(3)}}), key="stage0")
        time.sleep(600)
    """)
    producer = subprocess.Popen([sys.executable, "-c", code], env=dict(os.environ))
    try:
        assert from_env.get(key="stage0", timeout=60)["obs"].tolist() == [0, 0, 0]
        assert "env->policy" in from_env._filed.rings
        os.kill(producer.pid, signal.SIGKILL)
        producer.wait(timeout=10)
        with pytest.raises(PeerGoneError, match=r"peer 'run/env/0' died.*'run/env/0' \(pid"):
            from_env.get(key="stage0", timeout=60)
    finally:
        producer.kill()
        producer.wait(timeout=10)
        from_env.disconnect()
        policy.close()


def test_odd_arrays_keep_their_shape_and_dtype_through_the_ring(store: TCPStore) -> None:
    env, policy, to_policy, from_env = _ends(store)
    odd = {"scalar": np.asarray(5), "empty": np.zeros((0, 3)),
           "strided": np.arange(12.0).reshape(3, 4)[:, ::2], "half": np.ones(3, np.float16),
           "bf16": torch.ones(2, dtype=torch.bfloat16)}  # bfloat16: over the endpoint
    try:
        to_policy.put(Batch({"x": np.zeros(1)}), key="k")
        assert from_env.get(key="k")["x"].tolist() == [0.0]
        to_policy.put(Batch(odd, meta={"nested": {"a": [1, None]}}), key="k")
        to_policy.put(Batch({k: v for k, v in odd.items() if k != "bf16"}), key="k")
        for with_bf16 in (True, False):
            got = from_env.get(key="k")
            assert int(got["scalar"]) == 5 and got["scalar"].shape == ()
            assert got["empty"].shape == (0, 3)
            assert got["strided"].tolist() == odd["strided"].tolist()
            assert got["half"].dtype == np.float16
            assert ("bf16" in got) is with_bf16
        assert to_policy._ring is not None
    finally:
        to_policy.disconnect()
        from_env.disconnect()
        env.close()
        policy.close()
