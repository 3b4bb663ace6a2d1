"""The Megatron actor against FSDP2 and DDP: one GRPO optimizer step on the same model and
batch, on the same ranks (one core and one thread each), interleaved in rounds.

    python benchmarks/bench_megatron.py [--ranks 2] [--layers 4] [--hidden 256] ...

Every contender trains the same global batch (each data-parallel replica its share) from
the same weights: FSDP2 and DDP on every rank, and Megatron cut as tensor parallel over
all ranks (also with sequence parallelism), pipeline parallel over all ranks, and data
parallel only (also with the distributed optimizer). The ranks run each contender in turn,
round after round (A B C A B C ...); per contender the table shows the median seconds per
step, the CPU-seconds of all ranks per step, the ratio to FSDP2 and the optimizer state
each rank holds (what FSDP2 and the distributed optimizer shard).
The load average is recorded, and a run is refused while the machine is busy.
Last line: one JSON object, with ``megatron_best_vs_fsdp2`` (FSDP2's median step time over
the fastest Megatron cut's: above 1 means Megatron is faster).
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
from quiet import wait_for_quiet

CONTENDERS = ("fsdp2", "ddp", "megatron-tp", "megatron-tp-sp", "megatron-pp", "megatron-dp",
              "megatron-dp-dopt")


@dataclass(frozen=True)
class Setting:
    """The model, batch and schedule every contender runs."""

    ranks: int = 2
    layers: int = 4
    hidden: int = 256
    heads: int = 8
    kv_heads: int = 4
    ffn: int = 1024
    vocab: int = 1024
    prompts: int = 8
    group_size: int = 4
    prompt_len: int = 32
    response_len: int = 32
    micro_batch: int = 8
    steps: int = 3
    rounds: int = 3


def parse_args(argv: Sequence[str] | None) -> tuple[argparse.Namespace, Setting]:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    for name, value in asdict(Setting()).items():
        parser.add_argument(f"--{name.replace('_', '-')}", type=int, default=value)
    parser.add_argument("--contenders", default=",".join(CONTENDERS))
    parser.add_argument("--max-load", type=float, default=1.5,
                        help="refuse to run while the 1-minute load average is above this")
    parser.add_argument("--load-wait", type=float, default=120.0,
                        help="seconds to wait for the load to fall first")
    parser.add_argument("--worker", nargs=3, metavar=("RANK", "PORT", "OUT"),
                        help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    setting = Setting(**{k: getattr(args, k) for k in asdict(Setting())})
    rows = setting.prompts * setting.group_size
    if setting.ranks < 2 or setting.layers % setting.ranks or setting.heads % setting.ranks \
            or setting.kv_heads % setting.ranks or setting.vocab % setting.ranks:
        parser.error(f"--ranks {setting.ranks} must be >= 2 and divide --layers, --heads, "
                     "--kv-heads and --vocab (each Megatron cut spans every rank)")
    if setting.prompts % setting.ranks or rows % (setting.micro_batch * setting.ranks):
        parser.error("--prompts must split evenly over the ranks and each rank's rows into "
                     "--micro-batch rows")
    unknown = set(args.contenders.split(",")) - set(CONTENDERS)
    if unknown:
        parser.error(f"unknown contenders {sorted(unknown)}; choose from {CONTENDERS}")
    return args, setting


# -- one rank ------------------------------------------------------------------------------


def _model(setting: Setting) -> Any:
    from rlinf.workers.models import TinyLMConfig, build_tiny_causal_lm

    return build_tiny_causal_lm(TinyLMConfig(
        vocab_size=setting.vocab, hidden_size=setting.hidden, num_layers=setting.layers,
        num_heads=setting.heads, num_kv_heads=setting.kv_heads,
        intermediate_size=setting.ffn, attn_implementation="sdpa"), seed=0)


def _batch(setting: Setting) -> Any:
    import torch

    from rlinf.workers.rollout import RolloutBatch, RolloutSample

    gen = torch.Generator().manual_seed(0)
    rows = setting.prompts * setting.group_size
    samples = []
    for row in range(rows):
        prompt = setting.prompt_len - row % 4  # some left padding
        response = setting.response_len - row % 5  # and some right padding
        samples.append(RolloutSample(
            prompt_token_ids=tuple(torch.randint(4, setting.vocab, (prompt,),
                                                 generator=gen).tolist()),
            response_token_ids=tuple(torch.randint(4, setting.vocab, (response,),
                                                   generator=gen).tolist()),
            log_probs=tuple((-torch.rand(response, generator=gen) - 4.0).tolist()),
            finish_reason="length"))
    batch = RolloutBatch.from_samples(samples, answers=["0"] * rows,
                                      group_size=setting.group_size, pad_token_id=0)
    return batch.replace(rewards=torch.rand(rows, generator=gen))


def _actor(name: str, setting: Setting) -> Any:
    from rlinf.workers.actor import ActorConfig, PolicyTrainer
    from rlinf.workers.actor.megatron import MegatronActor, MegatronConfig

    model = _model(setting)
    parallelism = "fsdp2" if name == "fsdp2" else "ddp"
    config = ActorConfig(parallelism=parallelism, lr=1e-5,  # type: ignore[arg-type]
                         micro_batch_size=setting.micro_batch)
    if not name.startswith("megatron"):
        return PolicyTrainer(model, config=config)
    cut = {"megatron-tp": MegatronConfig(tensor_parallel=setting.ranks),
           "megatron-tp-sp": MegatronConfig(tensor_parallel=setting.ranks,
                                            sequence_parallel=True),
           "megatron-pp": MegatronConfig(pipeline_parallel=setting.ranks),
           "megatron-dp": MegatronConfig(),
           "megatron-dp-dopt": MegatronConfig(distributed_optimizer=True)}[name]
    return MegatronActor(model, config=config, megatron=cut)


def _replica_shard(actor: Any, batch: Any, rank: int, ranks: int) -> Any:
    """The rows this rank trains on: its data-parallel replica's share of the batch (every
    rank its own under FSDP2 and DDP; a Megatron cut's ranks share their replica's)."""
    replicas, index = ranks, rank
    if hasattr(actor, "megatron"):
        from megatron.core import parallel_state as ps

        replicas, index = actor.data_parallel, ps.get_data_parallel_rank()
    rows = batch.num_rows // replicas
    return batch.select(slice(index * rows, (index + 1) * rows))


def _optimizer_bytes(actor: Any) -> int:
    """Bytes of optimizer state this rank holds (an FSDP2 moment counts its local shard)."""
    total = 0
    for state in actor.optimizer.state.values():
        for value in state.values():
            local = value.to_local() if hasattr(value, "to_local") else value
            if getattr(local, "ndim", 0) > 0:
                total += local.numel() * local.element_size()
    return total


def _time_weight_gather(actor: Any) -> dict[str, float]:
    """Seconds to assemble the cut model in Hugging Face layout on rank 0, three ways: the
    actor's `state_dict_for_rollout` (tensor sends), the same shards pickled through
    ``gather_object`` (what it replaced), and one memcpy of the model's bytes (the limit)."""
    import torch
    import torch.distributed as dist
    from megatron.core import parallel_state as ps

    from rlinf.workers.actor.megatron import shards_to_hf

    out: dict[str, float] = {}
    dist.barrier()
    wall = time.perf_counter()
    total = sum(t.numel() * t.element_size() for bucket in actor.state_dict_for_rollout()
                for _, t in bucket)
    dist.barrier()
    out["tensor_sends_s"] = time.perf_counter() - wall
    wall = time.perf_counter()
    local = {k: v.detach().cpu() for k, v in actor.policy.state_dict().items()
             if isinstance(v, torch.Tensor)}
    mine = (ps.get_pipeline_model_parallel_rank(), ps.get_tensor_model_parallel_rank(), local)
    shards: list[Any] | None = [None] * dist.get_world_size() if dist.get_rank() == 0 else None
    dist.gather_object(mine, shards, dst=0)
    if shards is not None:
        shards_to_hf(shards, actor.shape, tensor_parallel=actor.megatron.tensor_parallel,
                     pipeline_parallel=actor.megatron.pipeline_parallel)
    dist.barrier()
    out["gather_object_s"] = time.perf_counter() - wall
    total_t = torch.tensor([float(total)])
    dist.broadcast(total_t, src=0)
    source = torch.empty(int(total_t[0]), dtype=torch.uint8)
    target = torch.empty_like(source)
    wall = time.perf_counter()
    target.copy_(source)
    out["memcpy_s"] = time.perf_counter() - wall
    out["bytes"] = float(total_t[0])
    return out


def worker(rank: int, port: int, out: str, setting: Setting, contenders: list[str]) -> None:
    import torch
    import torch.distributed as dist

    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank,
                            world_size=setting.ranks)
    batch = _batch(setting)
    results: list[dict[str, Any]] = []
    for round_index in range(setting.rounds):
        for name in contenders:
            actor = _actor(name, setting)
            shard = _replica_shard(actor, batch, rank, setting.ranks)
            actor.train(shard)  # warm-up: first kernels, optimizer state
            dist.barrier()
            seconds, cpu = [], []
            for _ in range(setting.steps):
                wall, used = time.perf_counter(), time.process_time()
                actor.train(shard)
                dist.barrier()
                seconds.append(time.perf_counter() - wall)
                cpu.append(time.process_time() - used)
            record = {"round": round_index, "contender": name, "rank": rank,
                      "seconds": seconds, "cpu_seconds": cpu,
                      "optimizer_bytes": _optimizer_bytes(actor)}
            if name == "megatron-tp":
                record["weight_gather"] = _time_weight_gather(actor)
            results.append(record)
            del actor
    Path(out, f"rank{rank}.json").write_text(json.dumps(results))
    dist.destroy_process_group()


# -- the driver ----------------------------------------------------------------------------


def summarize(records: list[dict[str, Any]], contenders: list[str]) -> dict[str, Any]:
    """Per contender: the median over rounds and steps of the slowest rank's step (a step
    ends when every rank's does) and the CPU-seconds of all ranks per step."""
    out: dict[str, Any] = {}
    for name in contenders:
        mine = [r for r in records if r["contender"] == name]
        steps: dict[tuple[int, int], list[tuple[float, float]]] = {}
        for record in mine:
            for i, (wall, cpu) in enumerate(zip(record["seconds"], record["cpu_seconds"],
                                                strict=True)):
                steps.setdefault((record["round"], i), []).append((wall, cpu))
        walls = [max(w for w, _ in ranks) for ranks in steps.values()]
        cpus = [sum(c for _, c in ranks) for ranks in steps.values()]
        out[name] = {"median_step_s": statistics.median(walls),
                     "cpu_s_per_step": statistics.median(cpus), "samples": len(walls),
                     "optimizer_mb_per_rank": max(r["optimizer_bytes"] for r in mine) / 2**20}
    return out


def main(argv: Sequence[str] | None = None) -> int:
    args, setting = parse_args(argv)
    contenders = args.contenders.split(",")
    if args.worker:
        rank, port, out = args.worker
        worker(int(rank), int(port), out, setting, contenders)
        return 0
    load_start = wait_for_quiet(args.max_load, args.load_wait)
    if load_start > args.max_load:
        print(f"bench-megatron: the 1-minute load average is {load_start:.2f}, above "
              f"--max-load {args.max_load:.2f}: the machine is busy and the figures would "
              "measure that. Run it when it is idle, or pass --max-load.", file=sys.stderr)
        return 2
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    with tempfile.TemporaryDirectory(prefix="bench-megatron-") as out:
        command = [sys.executable, __file__, *(argv if argv is not None else sys.argv[1:])]
        procs = [subprocess.Popen([*command, "--worker", str(rank), str(port), out],
                                  stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
                 for rank in range(setting.ranks)]
        logs = [p.communicate()[0] for p in procs]
        for proc, log in zip(procs, logs, strict=True):
            if proc.returncode != 0:
                print(log[-4000:], file=sys.stderr)
                return 1
        records = [r for rank in range(setting.ranks)
                   for r in json.loads(Path(out, f"rank{rank}.json").read_text())]
    table = summarize(records, contenders)
    base = table.get("fsdp2", {}).get("median_step_s")
    print(f"{'contender':<17} {'s/step':>8} {'CPU-s/step':>11} {'vs fsdp2':>9} "
          f"{'optim MB/rank':>14}")
    for name, row in table.items():
        ratio = f"{base / row['median_step_s']:.2f}" if base else "-"
        print(f"{name:<17} {row['median_step_s']:>8.3f} {row['cpu_s_per_step']:>11.3f} "
              f"{ratio:>9} {row['optimizer_mb_per_rank']:>14.1f}")
    gathers = [r["weight_gather"] for r in records if r["rank"] == 0 and "weight_gather" in r]
    weight_gather = None
    if gathers:
        weight_gather = {key: statistics.median(g[key] for g in gathers)
                         for key in ("tensor_sends_s", "gather_object_s", "memcpy_s", "bytes")}
        print(f"weight gather of the TP cut to rank 0 ({weight_gather['bytes'] / 2**20:.1f} MB, "
              f"median of {len(gathers)}): tensor sends {weight_gather['tensor_sends_s']:.3f} s, "
              f"gather_object {weight_gather['gather_object_s']:.3f} s "
              f"({weight_gather['gather_object_s'] / weight_gather['tensor_sends_s']:.2f}x), "
              f"memcpy {weight_gather['memcpy_s']:.4f} s")
    megatron = [row["median_step_s"] for name, row in table.items()
                if name.startswith("megatron")]
    verdict = {"setting": asdict(setting), "contenders": table,
               "megatron_best_vs_fsdp2": (base / min(megatron)) if base and megatron else None,
               "weight_gather": weight_gather,
               "load_average": [round(load_start, 2), round(os.getloadavg()[0], 2)]}
    print(json.dumps(verdict))
    return 0


if __name__ == "__main__":
    sys.exit(main())
