from __future__ import annotations

import pickle
import socket
import subprocess
import sys
from pathlib import Path

import pytest
import torch

HERE = Path(__file__).parent
sys.path.insert(0, str(HERE))
from receiver import CONFIG, log_probs_of  # noqa: E402

from rlinf.workers.actor import ActorConfig, PolicyTrainer  # noqa: E402
from rlinf.workers.errors import ConfigError  # noqa: E402
from rlinf.workers.models import build_char_tokenizer, build_tiny_causal_lm  # noqa: E402
from rlinf.workers.rollout import HFRolloutEngine, RolloutBatch, RolloutSample  # noqa: E402
from rlinf.workers.weight_sync import (  # noqa: E402
    CollectiveWeightGroup,
    ShmWeightSender,
    choose_transport,
    flatten_bucket,
    iter_buckets,
    plan_layout,
    sync_in_process,
    unflatten_bucket,
)

BUCKET = 24_000


def _trained_actor() -> PolicyTrainer:
    """An actor one GRPO step away from its initialisation (so synced weights are new)."""
    model = build_tiny_causal_lm(CONFIG, seed=0, tokenizer=build_char_tokenizer())
    gen = torch.Generator().manual_seed(0)
    samples = [RolloutSample(prompt_token_ids=(5, 6, 7), response_token_ids=tuple(
        torch.randint(4, 90, (4,), generator=gen).tolist()), log_probs=(-4.0,) * 4,
        finish_reason="length") for _ in range(4)]
    batch = RolloutBatch.from_samples(samples, answers=["0"] * 4, group_size=4, pad_token_id=0)
    actor = PolicyTrainer(model, config=ActorConfig(parallelism="none", lr=1e-2))
    actor.train(batch.replace(rewards=torch.tensor([1.0, 0.0, 0.0, 0.0])))
    return actor


def test_buckets_respect_the_bound_and_keep_order():
    named = [(f"t{i}", torch.zeros(n)) for i, n in enumerate([10, 10, 30, 5, 100, 1])]
    buckets = list(iter_buckets(named, bucket_bytes=80))  # float32: 4 bytes each
    assert [[n for n, _ in b] for b in buckets] == [["t0", "t1"], ["t2"], ["t3"], ["t4"], ["t5"]]
    assert list(iter_buckets([], bucket_bytes=8)) == []
    with pytest.raises(ConfigError):
        list(iter_buckets(named, bucket_bytes=0))


def test_flatten_round_trips_every_dtype_as_views():
    bucket = [("a", torch.randn(3, 5)), ("b", torch.arange(7, dtype=torch.int64)),
              ("c", torch.randn(4, 2).to(torch.bfloat16)), ("d", torch.tensor([True, False])),
              ("e", torch.randn(6, 4).t())]  # non-contiguous input
    buffer, metas = flatten_bucket(bucket)
    assert buffer.numel() == plan_layout(bucket)[1]
    assert all(m.offset % 64 == 0 for m in metas)
    restored = unflatten_bucket(buffer, metas)
    for (name, original), (rname, view) in zip(bucket, restored, strict=True):
        assert name == rname and view.dtype == original.dtype
        assert torch.equal(view, original)
    restored[0][1].fill_(7.0)  # views, not copies
    assert torch.equal(unflatten_bucket(buffer, metas)[0][1], torch.full((3, 5), 7.0))


def test_in_process_sync_makes_rollout_log_probs_equal_the_trainers():
    actor = _trained_actor()
    rollout_model = build_tiny_causal_lm(CONFIG, seed=99, tokenizer=build_char_tokenizer())
    engine = HFRolloutEngine(rollout_model, eos_token_id=2, pad_token_id=0)
    expected = log_probs_of(actor.model)
    assert not torch.allclose(log_probs_of(rollout_model), expected, atol=1e-3)
    synced = sync_in_process(actor.state_dict_for_rollout(bucket_bytes=BUCKET), engine)
    assert synced >= sum(p.numel() * 4 for p in actor.model.parameters())
    torch.testing.assert_close(log_probs_of(rollout_model), expected, atol=1e-6, rtol=0)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _receiver(mode: str, sent: object, tmp_path: Path, *extra: str) -> subprocess.Popen[str]:
    with open(tmp_path / f"{mode}.in", "wb") as f:
        pickle.dump(sent, f)
    return subprocess.Popen(
        [sys.executable, str(HERE / "receiver.py"), mode, str(tmp_path / f"{mode}.in"),
         str(tmp_path / f"{mode}.out"), *extra],
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)


def _finish(proc: subprocess.Popen[str], mode: str, tmp_path: Path) -> dict[str, torch.Tensor]:
    log = proc.communicate(timeout=180)[0]
    assert proc.returncode == 0, log[-3000:]
    return torch.load(tmp_path / f"{mode}.out")


def test_shm_and_gloo_broadcast_sync_another_process(tmp_path):
    actor = _trained_actor()
    expected = log_probs_of(actor.model)
    buckets = list(actor.state_dict_for_rollout(bucket_bytes=BUCKET))
    assert len(buckets) > 1

    sender = ShmWeightSender()
    handles = [sender.export(b) for b in buckets]
    shm_proc = _receiver("shm", handles, tmp_path)
    port = _free_port()
    layouts = [plan_layout(b) for b in buckets]
    gloo_proc = _receiver("gloo", layouts, tmp_path, str(port))
    group = CollectiveWeightGroup(host="127.0.0.1", port=port, rank=0, world_size=2,
                                  backend="gloo", timeout=120)
    for bucket in buckets:
        group.send(bucket)
    try:
        for mode, proc in (("shm", shm_proc), ("gloo", gloo_proc)):
            result = _finish(proc, mode, tmp_path)
            assert not torch.allclose(result["before"], expected, atol=1e-3)
            torch.testing.assert_close(result["after"], expected, atol=1e-6, rtol=0)
    finally:
        group.close()
        for handle in handles:
            sender.release(handle)
        sender.close()


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_cuda_ipc_syncs_a_collocated_process(tmp_path):
    from rlinf.workers.weight_sync import CudaIpcWeightSender

    actor = _trained_actor()
    expected = log_probs_of(actor.model)
    sender = CudaIpcWeightSender("cuda")
    handles = [sender.export([(n, t.cuda()) for n, t in b])
               for b in actor.state_dict_for_rollout(bucket_bytes=BUCKET)]
    result = _finish(_receiver("cuda_ipc", handles, tmp_path), "cuda_ipc", tmp_path)
    torch.testing.assert_close(result["after"], expected, atol=1e-5, rtol=0)
    for handle in handles:
        sender.release(handle)
    sender.close()


def test_transport_follows_the_placement():
    assert choose_transport(same_process=True, same_node=True, same_device=True,
                            on_gpu=True) == "inprocess"
    assert choose_transport(same_process=False, same_node=True, same_device=True,
                            on_gpu=True) == "cuda_ipc"
    assert choose_transport(same_process=False, same_node=True, same_device=False,
                            on_gpu=True) == "nccl"
    assert choose_transport(same_process=False, same_node=False, same_device=False,
                            on_gpu=True) == "nccl"
    assert choose_transport(same_process=False, same_node=True, same_device=False,
                            on_gpu=False) == "shm"
    assert choose_transport(same_process=False, same_node=False, same_device=False,
                            on_gpu=False) == "gloo"
