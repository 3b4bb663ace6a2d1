"""Benchmark the M2Flow planner on paper-like workloads from 8 to 1024 devices.

For every workload (see `sched_workloads.py` for the cost models and where their numbers
come from) and cluster size it plans with `rlinf.sched.planner.plan`, compares the chosen
plan's simulated iteration time with the best collocated-only and disaggregated-only plans,
and, where the space is small enough, with `exhaustive_search` over the same micro-batch
candidates (device ranges in steps of `unit`). Prints a table and, as the last line, a JSON
object: ``max_gap_vs_exhaustive`` (planner time / exhaustive time - 1, worst case; ≤ 0 means
the planner, which also searches finer than `unit`, found a plan at least as fast),
``min_speedup_vs_best_fixed`` (best fixed-mode time / planner time, worst case) and
``plan_seconds_1024`` (slowest planning time on 1024 devices). "n/a" marks a fixed mode with
no feasible plan (e.g. too few devices to give every component its own memory).

Launch: ``tox -e bench-sched`` or ``python benchmarks/bench_sched.py [--quick]``.
"""

from __future__ import annotations

import argparse
import json
import logging
import math
import sys
import time
from pathlib import Path

import structlog

sys.path.insert(0, str(Path(__file__).resolve().parent))

from sched_workloads import Workload, all_workloads

from rlinf.sched.cluster import Cluster
from rlinf.sched.planner import PlannerOptions, exhaustive_search, plan

MAX_CHUNKS = 8
EXHAUSTIVE_LIMIT = 20_000


def exhaustive_unit(workload: Workload, devices: int) -> int | None:
    """Smallest range step (in devices) that keeps the exhaustive space under the limit."""
    comps = len(workload.workflow.components)
    unit = 1
    while unit <= devices:
        if devices % unit == 0:
            slots = devices // unit
            if (slots * (slots + 1) // 2) ** comps <= EXHAUSTIVE_LIMIT:
                return unit
        unit *= 2
    return None


def run_case(workload: Workload, devices: int, *, with_exhaustive: bool) -> dict[str, object]:
    """Plan one workload on one cluster size and compare with the baselines."""
    cluster = Cluster.uniform(devices // 8, 8, "80GiB", "H100")
    options = PlannerOptions(max_chunks=MAX_CHUNKS)
    started = time.perf_counter()
    result = plan(workload.workflow, workload.cost, cluster, options=options)
    seconds = time.perf_counter() - started
    best = result.best
    row: dict[str, object] = {
        "workload": workload.name, "devices": devices, "plan": best.spec,
        "mode": best.mode.value, "time": best.predicted_time, "seconds": seconds,
        "micro_batch": dict(best.micro_batch),
    }
    for kind in ("collocated", "disaggregated"):
        base = result.baselines.get(kind)
        row[kind] = base.predicted_time if base else math.inf
    unit = exhaustive_unit(workload, devices) if with_exhaustive else None
    if unit is not None:
        exh = exhaustive_search(workload.workflow, workload.cost, cluster, unit=unit,
                                max_chunks=MAX_CHUNKS, keep=1)
        row["exhaustive"] = exh.best.predicted_time
        row["unit"] = unit
    return row


def main(argv: list[str] | None = None) -> int:
    """Run the suite and print the table and the JSON summary line."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="only the smallest cluster sizes")
    args = parser.parse_args(argv)
    structlog.configure(wrapper_class=structlog.make_filtering_bound_logger(logging.WARNING))
    rows = []
    for workload, sizes in all_workloads():
        for i, devices in enumerate(sizes[:1] if args.quick else sizes):
            rows.append(run_case(workload, devices, with_exhaustive=i == 0))
    header = (f"{'workload':<20} {'dev':>5} {'mode':<13} {'pred s':>8} {'vs coll':>8} "
              f"{'vs disagg':>9} {'vs exh':>12} {'plan s':>7}  chosen plan / micro-batches")
    print(header)
    print("-" * len(header))
    gaps, speedups, seconds_1024 = [], [], []
    for r in rows:
        t = float(r["time"])  # type: ignore[arg-type]
        coll, dis = float(r["collocated"]), float(r["disaggregated"])  # type: ignore[arg-type]
        speedups.append(min(coll, dis) / t)
        exh = ""
        if "exhaustive" in r:
            gap = t / float(r["exhaustive"]) - 1  # type: ignore[arg-type]
            gaps.append(gap)
            exh = f"{gap:+.2%} u{r['unit']}"
        if r["devices"] == 1024:
            seconds_1024.append(float(r["seconds"]))  # type: ignore[arg-type]
        vs_coll = f"{coll / t:.2f}x" if math.isfinite(coll) else "n/a"
        vs_dis = f"{dis / t:.2f}x" if math.isfinite(dis) else "n/a"
        print(f"{r['workload']:<20} {r['devices']:>5} {r['mode']:<13} {t:>8.2f} "
              f"{vs_coll:>8} {vs_dis:>9} {exh:>12} {float(r['seconds']):>7.2f}  "  # type: ignore[arg-type]
              f"{r['plan']}  {r['micro_batch']}")
    summary = {
        "max_gap_vs_exhaustive": round(max(gaps), 6) if gaps else None,
        "min_speedup_vs_best_fixed": round(min(speedups), 6),
        "plan_seconds_1024": round(max(seconds_1024), 3) if seconds_1024 else None,
        "cases": len(rows),
    }
    print(json.dumps(summary))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
