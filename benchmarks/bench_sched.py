"""Benchmark the M2Flow planner on paper-like workloads from 4 to 1024 devices.

For every workload (see `sched_workloads.py` for the cost models and where their numbers
come from) and cluster size it plans with `rlinf.sched.planner.plan` and compares the chosen
plan's simulated iteration time with the best collocated-only and disaggregated-only plans.
On small clusters (4 to 16 devices, `small_cluster_workloads`) it also runs
`exhaustive_search` at a one-device step over the planner's micro-batch candidates (exact
branch and bound: the true optimum of the planner's space) and, for information, the
large-cluster search alone (``PlannerOptions(exact_limit=0)``). Every small-cluster workload
but PPO (`MIXED_SKIP`) also runs on a mixed node (`mixed_cluster`: 80, 80, 40, 40, 40, 40,
80, 80 GB, where the rollout's KV-cache reservation fits the 80 GB devices only), against
exhaustive search too and against the planner restricted to contiguous ranges
(``reorder_devices=False``). Every small-cluster workload also runs on CPU slots that share
their node's cores (`SHARED`: 4 slots of a 2-core node, as a user's box or CI runs
`cluster.cpu_slots=4`; `rlinf.sched.core_sharing`), against exhaustive search too, with its
planning time.

Prints a table and, as the last line, a JSON object: ``max_gap_vs_exhaustive`` (planner time
/ exhaustive time - 1, worst case over the ``exhaustive_cases`` one-device-step comparisons),
``max_gap_search_only`` (the same for the large-cluster search alone),
``min_speedup_vs_best_fixed`` (best fixed-mode time / planner time, worst case),
``plan_seconds_1024`` (slowest planning time on 1024 devices), ``cases``,
``mixed_cases``, ``min_speedup_mixed_vs_contiguous`` (contiguous-only time / planner time
on the mixed node, worst case: non-contiguous sets never lose) and
``mixed_cases_only_noncontiguous_fits`` (mixed cases no contiguous plan fits),
``shared_cases`` and ``plan_seconds_shared`` (slowest planning time on the shared-cores
node). "n/a" marks a fixed mode with no feasible plan (e.g. too few devices to give every
component its own memory).

Launch: ``tox -e bench-sched`` or ``python benchmarks/bench_sched.py [--quick]``.
"""

from __future__ import annotations

import argparse
import json
import logging
import math
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import structlog

sys.path.insert(0, str(Path(__file__).resolve().parent))

from sched_workloads import Workload, all_workloads, small_cluster_workloads

from rlinf.sched.cluster import Cluster, Device, Node
from rlinf.sched.errors import PlanningError
from rlinf.sched.planner import PlannerOptions, exhaustive_search, plan

MAX_CHUNKS = 8


@dataclass(frozen=True)
class Case:
    """One planned workload on one cluster size."""

    workload: str
    devices: int
    spec: str
    mode: str
    time: float
    seconds: float
    micro_batch: dict[str, int]
    collocated: float
    disaggregated: float
    exhaustive: float | None = None
    """Step-1 exhaustive optimum (small clusters only)."""
    search_only: float | None = None
    """The large-cluster search alone (small clusters only)."""
    contiguous: float | None = None
    """The planner over contiguous ranges only (mixed node only)."""
    cluster: str = ""
    """``"mixed"`` for the mixed node, ``"shared"`` for the shared-cores node, else empty
    (uniform H100-like nodes)."""


def cluster_of(devices: int) -> Cluster:
    """H100-like nodes of up to 8 devices."""
    return Cluster.uniform(max(1, devices // 8), min(devices, 8), "80GiB", "H100")


MIXED_GB = (80, 80, 40, 40, 40, 40, 80, 80)
MIXED_SKIP = {"ppo-critic-7b"}
"""Not on the mixed node: five components, whose exhaustive and contiguous-only searches
there take minutes (planned: 838 s, contiguous only 1120 s)."""


def mixed_cluster() -> Cluster:
    """One node of 80 GB devices at both ends and 40 GB ones between (`MIXED_GB`)."""
    devices = tuple(Device(i, 0, i, "H100" if gb == 80 else "A100-40G", gb * 2**30)
                    for i, gb in enumerate(MIXED_GB))
    return Cluster((Node(0, "mixed", tuple(range(len(devices))), nvlink=True),), devices)


SHARED = (4, 2)
"""CPU slots and cores of the shared-cores node."""


def shared_cluster() -> Cluster:
    """One node of `SHARED` CPU slots on fewer cores (80 GB each, so memory never binds)."""
    slots, cores = SHARED
    return Cluster.uniform(1, slots, "80GiB", "cpu", cpus_per_node=cores)


def run_case(workload: Workload, devices: int, *, exact: bool, mixed: bool = False,
             shared: bool = False) -> Case:
    """Plan one workload on one cluster size (or the mixed or shared-cores node); with
    `exact`, compare with step-1 exhaustive."""
    cluster = (mixed_cluster() if mixed else shared_cluster() if shared
               else cluster_of(devices))
    options = PlannerOptions(max_chunks=MAX_CHUNKS)
    started = time.perf_counter()
    result = plan(workload.workflow, workload.cost, cluster, options=options)
    seconds = time.perf_counter() - started
    best = result.best
    fixed = {k: (p.predicted_time if (p := result.baselines.get(k)) else math.inf)
             for k in ("collocated", "disaggregated")}
    exhaustive = search_only = None
    if exact:
        exh = exhaustive_search(workload.workflow, workload.cost, cluster, unit=1,
                                max_chunks=MAX_CHUNKS, keep=1)
        exhaustive = exh.best.predicted_time
        alone = plan(workload.workflow, workload.cost, cluster,
                     options=PlannerOptions(max_chunks=MAX_CHUNKS, exact_limit=0))
        search_only = alone.best.predicted_time
    contiguous = None
    if mixed:
        try:
            contiguous = plan(workload.workflow, workload.cost, cluster, options=PlannerOptions(
                max_chunks=MAX_CHUNKS, reorder_devices=False)).best.predicted_time
        except PlanningError:  # no contiguous range of 80 GB devices is large enough
            contiguous = math.inf
    return Case(workload.name, devices, best.spec, best.mode.value, best.predicted_time,
                seconds, dict(best.micro_batch), fixed["collocated"], fixed["disaggregated"],
                exhaustive, search_only, contiguous,
                "mixed" if mixed else "shared" if shared else "")


def _ratio(base: float, t: float) -> str:
    return f"{base / t:.2f}x" if math.isfinite(base) else "n/a"


def main(argv: list[str] | None = None) -> int:
    """Run the suite and print the table and the JSON summary line."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true",
                        help="only the small clusters and each workload's smallest other one")
    args = parser.parse_args(argv)
    structlog.configure(wrapper_class=structlog.make_filtering_bound_logger(logging.WARNING))
    cases = []
    for workload, sizes in small_cluster_workloads():
        for devices in sizes:
            cases.append(run_case(workload, devices, exact=True))
    for workload, _sizes in small_cluster_workloads():
        if workload.name not in MIXED_SKIP:
            cases.append(run_case(workload, len(MIXED_GB), exact=True, mixed=True))
    for workload, _sizes in small_cluster_workloads():
        cases.append(run_case(workload, SHARED[0], exact=True, shared=True))
    done = {(c.workload, c.devices) for c in cases if not c.cluster}
    for workload, sizes in all_workloads():
        for devices in sizes[:1] if args.quick else sizes:
            if (workload.name, devices) not in done:
                cases.append(run_case(workload, devices, exact=False))
    header = (f"{'workload':<20} {'dev':>6} {'mode':<13} {'pred s':>8} {'vs coll':>8} "
              f"{'vs disagg':>9} {'vs exh':>8} {'search':>8} {'plan s':>7}  "
              "chosen plan / micro-batches")
    print(header)
    print("-" * len(header))
    gaps, search_gaps, speedups, seconds_1024 = [], [], [], []
    mixed = [c.contiguous / c.time for c in cases if c.contiguous is not None]
    shared = [c for c in cases if c.cluster == "shared"]
    finite_mixed = [r for r in mixed if math.isfinite(r)]
    for c in cases:
        speedups.append(min(c.collocated, c.disaggregated) / c.time)
        exh = search = ""
        if c.exhaustive is not None and c.search_only is not None:
            gaps.append(c.time / c.exhaustive - 1)
            search_gaps.append(c.search_only / c.exhaustive - 1)
            exh, search = f"{gaps[-1]:+.2%}", f"{search_gaps[-1]:+.2%}"
        if c.devices == 1024:
            seconds_1024.append(c.seconds)
        where = f"{c.devices}{c.cluster[:1]}"
        extra = "" if c.contiguous is None else (
            f"  ({_ratio(c.contiguous, c.time)} vs contiguous)" if math.isfinite(c.contiguous)
            else "  (no contiguous plan fits)")
        print(f"{c.workload:<20} {where:>6} {c.mode:<13} {c.time:>8.2f} "
              f"{_ratio(c.collocated, c.time):>8} {_ratio(c.disaggregated, c.time):>9} "
              f"{exh:>8} {search:>8} {c.seconds:>7.2f}  {c.spec}  {c.micro_batch}{extra}")
    summary = {
        "max_gap_vs_exhaustive": round(max(gaps), 6) if gaps else None,
        "max_gap_search_only": round(max(search_gaps), 6) if search_gaps else None,
        "min_speedup_vs_best_fixed": round(min(speedups), 6),
        "plan_seconds_1024": round(max(seconds_1024), 3) if seconds_1024 else None,
        "cases": len(cases),
        "exhaustive_cases": len(gaps),
        "mixed_cases": len(mixed),
        "min_speedup_mixed_vs_contiguous": round(min(finite_mixed), 6) if finite_mixed
        else None,
        "mixed_cases_only_noncontiguous_fits": len(mixed) - len(finite_mixed),
        "shared_cases": len(shared),
        "plan_seconds_shared": round(max(c.seconds for c in shared), 3) if shared else None,
    }
    print(json.dumps(summary))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
