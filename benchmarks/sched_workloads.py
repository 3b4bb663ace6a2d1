"""Workloads for the planner benchmark, modelled on the RLinf paper's (arXiv 2509.15965).

Each workload is a `Workflow` plus an `AnalyticCostModel` whose numbers come from first
principles on H100-80GB devices (989 TFLOP/s dense bf16, 3.35 TB/s HBM, ~25 GB/s PCIe for
offload), not from measurements:

- training time per sequence = 6 · params · tokens / (devices · 989e12 · MFU), MFU 0.25–0.35;
  log-prob inference is a third of that (forward only);
- decoding is memory-bandwidth bound: per-GPU throughput of ~15k tokens/s for a 1.5B model,
  ~5k for 7B (vLLM-class continuous batching), ~2k for a 10B-active MoE;
- responses average 6k tokens (math reasoning with R1-style models) and are long-tailed: the
  slowest of b sequences sets the call length (``tail``), and streaming emission follows
  "half the responses finish within a quarter of the rollout time";
- optimizer state is 16 bytes/param sharded by FSDP; rollout engines reserve most of the
  device for KV cache, so rollout and training cannot co-reside and must switch (offload
  over PCIe: seconds);
- embodied: a CPU physics step of ~10 ms per env spread over the ~64 host cores next to each
  GPU plus ~0.4 ms per env of single-process bookkeeping that does not parallelise (LIBERO /
  MuJoCo class), vs a GPU-rendered simulator at ~2 ms per env per GPU holding ~40 GiB plus
  0.25 GB per env of physics and render buffers (ManiSkill3 class), which cannot share a
  device with the policy without switching; VLA (7B) inference ~4 ms per env per step per
  GPU; 32 control steps per iteration.
"""

from __future__ import annotations

from dataclasses import dataclass

from rlinf.sched.analytic_costs import AnalyticCost, AnalyticCostModel
from rlinf.sched.workflow import Component, Edge, Loop, Workflow

GIB = 2**30
LONG_TAIL = ((0.5, 0.25), (0.8, 0.5), (0.95, 0.75), (1.0, 1.0))
TOKENS = 7_000  # prompt ~1k + response ~6k
H100_FLOPS = 989e12


@dataclass(frozen=True)
class Workload:
    """A benchmark case: workflow, costs and what it models."""

    name: str
    workflow: Workflow
    cost: AnalyticCostModel
    note: str


def _train_per_item(params: float, mfu: float) -> float:
    return 6 * params * TOKENS / (H100_FLOPS * mfu)


def grpo(name: str, *, params: float, decode_tps: float, tp: int, batch: int) -> Workload:
    """GRPO on math: rollout (streaming, long tail) → reward (CPU) → inference → actor."""
    train = _train_per_item(params, 0.3)
    wf = Workflow(
        components=(
            Component("rollout", streaming=True, completion=LONG_TAIL, device_multiple=tp),
            Component("reward", resource="cpu"),
            Component("inference", device_multiple=tp),
            Component("actor"),
        ),
        edges=(
            Edge("rollout", "reward", bytes_per_item=4 * TOKENS),
            Edge("reward", "inference", bytes_per_item=4 * TOKENS + 4),
            Edge("inference", "actor", bytes_per_item=12 * TOKENS),
        ),
        global_batch=batch, name=name,
    )
    weights = 2 * params
    cost = AnalyticCostModel({
        "rollout": AnalyticCost(fixed=1.0, per_item=6_000 / decode_tps, tail=0.1,
                                replicated=0.8 * 80 * GIB,  # vLLM reserves 80% for weights + KV
                                switch=2 * weights / tp / 25e9 + 1.0),
        "reward": AnalyticCost(fixed=0.2, per_item=0.02),
        "inference": AnalyticCost(fixed=0.3, per_item=train / 3, sharded=weights * 2,
                                  replicated=6 * GIB, switch=2 * weights / 25e9),
        "actor": AnalyticCost(fixed=0.5, per_item=train, sync=0.05 * params / 1e9,
                              sharded=16 * params, replicated=12 * GIB,
                              switch=16 * params / 8 / 25e9 + 0.5),
    })
    return Workload(name, wf, cost, f"{params / 1e9:.1f}B GRPO, batch {batch} sequences")


def ppo_critic(batch: int = 1024) -> Workload:
    """PPO with a critic: rollout → reward → inference (log-probs + values) → actor, critic."""
    params = 7.6e9
    train = _train_per_item(params, 0.3)
    wf = Workflow(
        components=(
            Component("rollout", streaming=True, completion=LONG_TAIL, device_multiple=2),
            Component("reward", resource="cpu"),
            Component("inference", device_multiple=2),
            Component("critic"),
            Component("actor"),
        ),
        edges=(
            Edge("rollout", "reward", bytes_per_item=4 * TOKENS),
            Edge("reward", "inference", bytes_per_item=4 * TOKENS + 4),
            Edge("inference", "critic", bytes_per_item=8 * TOKENS),
            Edge("inference", "actor", bytes_per_item=12 * TOKENS),
        ),
        global_batch=batch, name="ppo-critic-7b",
    )
    cost = AnalyticCostModel({
        "rollout": AnalyticCost(fixed=1.0, per_item=6_000 / 5_000, tail=0.1,
                                replicated=0.8 * 80 * GIB, switch=3.0),
        "reward": AnalyticCost(fixed=0.2, per_item=0.02),
        "inference": AnalyticCost(fixed=0.3, per_item=2 * train / 3, sharded=3 * 2 * params,
                                  replicated=6 * GIB, switch=2.5),
        "critic": AnalyticCost(fixed=0.5, per_item=train, sync=0.4, sharded=16 * params,
                               replicated=12 * GIB, switch=5.5),
        "actor": AnalyticCost(fixed=0.5, per_item=train, sync=0.4, sharded=16 * params,
                              replicated=12 * GIB, switch=5.5),
    })
    return Workload("ppo-critic-7b", wf, cost, "7B PPO: actor, critic, reference, reward")


def embodied(*, gpu_render: bool, envs: int = 512, steps: int = 32) -> Workload:
    """Embodied PPO: env ↔ rollout (VLA policy) for `steps` steps, then actor training."""
    name = "embodied-gpu-render" if gpu_render else "embodied-cpu-sim"
    wf = Workflow(
        components=(
            Component("env", resource="gpu" if gpu_render else "cpu"),
            Component("rollout"),
            Component("actor"),
        ),
        edges=(
            Edge("env", "rollout", bytes_per_item=3 * 224 * 224),
            Edge("rollout", "env", bytes_per_item=64, feedback=True),
            Edge("rollout", "actor", bytes_per_item=steps * (3 * 224 * 224 + 256)),
        ),
        loops=(Loop(("env", "rollout"), steps),),
        global_batch=envs, name=name,
    )
    env = (AnalyticCost(fixed=0.005, per_item=0.002, replicated=40 * GIB,
                        per_item_memory=0.25e9, switch=1.5) if gpu_render
           else AnalyticCost(fixed=0.002, per_item=0.010 / 64, serial_per_item=4e-4))
    cost = AnalyticCostModel({
        "env": env,
        "rollout": AnalyticCost(fixed=0.015, per_item=0.004, replicated=16 * GIB,
                                per_item_memory=20e6, switch=1.5),
        "actor": AnalyticCost(fixed=0.5, per_item=_train_per_item(7e9, 0.3) * steps / 28,
                              sync=0.4, sharded=16 * 7e9, replicated=20 * GIB, switch=6.0),
    })
    what = "GPU-rendered simulator (ManiSkill3-like)" if gpu_render else "CPU physics (LIBERO-like)"
    return Workload(name, wf, cost, f"7B VLA, {envs} envs × {steps} steps, {what}")


def moe(batch: int = 2048, *, params: float = 100e9, active: float = 10e9, ep: int = 8,
        actor_min: int = 32, name: str = "grpo-moe-100b") -> Workload:
    """GRPO on an MoE (default 100B total, 10B active): expert-parallel groups of `ep`
    devices; the actor needs at least `actor_min` devices."""
    train = _train_per_item(active, 0.25)
    wf = Workflow(
        components=(
            Component("rollout", streaming=True, completion=LONG_TAIL, device_multiple=ep),
            Component("reward", resource="cpu"),
            Component("inference", device_multiple=ep, min_devices=ep),
            Component("actor", device_multiple=ep, min_devices=actor_min),
        ),
        edges=(
            Edge("rollout", "reward", bytes_per_item=4 * TOKENS),
            Edge("reward", "inference", bytes_per_item=4 * TOKENS + 4),
            Edge("inference", "actor", bytes_per_item=12 * TOKENS),
        ),
        global_batch=batch, name=name,
    )
    cost = AnalyticCostModel({
        "rollout": AnalyticCost(fixed=2.0, per_item=6_000 / 2_000, tail=0.1,
                                replicated=0.8 * 80 * GIB, switch=12.0),
        "reward": AnalyticCost(fixed=0.2, per_item=0.02),
        "inference": AnalyticCost(fixed=1.0, per_item=train / 3, sharded=2 * params,
                                  replicated=8 * GIB, switch=10.0),
        "actor": AnalyticCost(fixed=2.0, per_item=train, sync=2.0, sharded=16 * params,
                              replicated=16 * GIB, switch=20.0),
    })
    return Workload(name, wf, cost, f"MoE {params / 1e9:.0f}B/{active / 1e9:.1f}B-active GRPO, "
                    f"EP groups of {ep}")


def all_workloads() -> list[tuple[Workload, tuple[int, ...]]]:
    """Every workload with the cluster sizes (devices, 8 per node) it is planned on."""
    return [
        (grpo("grpo-1.5b", params=1.5e9, decode_tps=15_000, tp=1, batch=4096), (8, 64, 1024)),
        (grpo("grpo-7b", params=7.6e9, decode_tps=5_000, tp=2, batch=2048), (8, 128, 1024)),
        (ppo_critic(), (8, 256, 1024)),
        (embodied(gpu_render=False), (8, 64, 1024)),
        (embodied(gpu_render=True), (8, 64, 1024)),
        (moe(), (64, 256, 1024)),
    ]


def small_cluster_workloads() -> list[tuple[Workload, tuple[int, ...]]]:
    """Every workload on 4 to 16 devices, where exhaustive search at a one-device step is
    feasible: the same workloads (batches unchanged: the search space does not depend on
    them), except the MoE, scaled to 16B total / 2.5B active with EP groups of 4, an actor
    on at least 4 devices and a batch of 512 (the 100B model needs 32 devices for its
    optimizer state). Not on 16 devices: PPO with a critic (five components) and the MoE,
    whose exact search there takes minutes."""
    return [
        (grpo("grpo-1.5b", params=1.5e9, decode_tps=15_000, tp=1, batch=4096), (4, 8, 16)),
        (grpo("grpo-7b", params=7.6e9, decode_tps=5_000, tp=2, batch=2048), (4, 8, 16)),
        (ppo_critic(), (4, 8)),
        (embodied(gpu_render=False), (4, 8, 16)),
        (embodied(gpu_render=True), (4, 8, 16)),
        (moe(512, params=16e9, active=2.5e9, ep=4, actor_min=4, name="grpo-moe-16b"), (4, 8)),
    ]
