"""``rlinf-plan``: plan a workflow on a cluster from files, print the ranked plans.

Usage::

    rlinf-plan WORKFLOW COSTS CLUSTER [--out plan.json] [--gantt plan.png] [--top 5]

WORKFLOW is a workflow file (`rlinf.sched.workflow`), COSTS an analytic cost file or a
profiler profile (`rlinf.sched.analytic_costs.load_cost_model`), CLUSTER a cluster file
(`rlinf.sched.cluster.Cluster.from_file`); JSON or YAML. Writes the plan document (best plan,
alternatives, baselines) as JSON and a Gantt chart of the best plan's simulated iteration.
``--gantt ''`` skips the chart. Exit status 0 on success, 2 on bad input or when no plan fits:
then one line on stderr names the file, the key inside it and what was expected.
"""

from __future__ import annotations

import argparse
import math
import sys
from collections.abc import Sequence
from pathlib import Path

from rlinf.sched.analytic_costs import load_cost_model
from rlinf.sched.cluster import Cluster
from rlinf.sched.errors import SchedError
from rlinf.sched.execution_plan import ExecutionPlan, PlanResult
from rlinf.sched.model_parallel import format_cut
from rlinf.sched.planner import PlannerOptions, PlanProgress, exhaustive_search, plan
from rlinf.sched.planner.progress import PROGRESS_EVERY_S
from rlinf.sched.simulator import simulate
from rlinf.sched.workflow import Workflow

__all__ = ["format_table", "main"]


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="rlinf-plan", description=__doc__.splitlines()[0])
    p.add_argument("workflow", type=Path, help="workflow file (JSON/YAML)")
    p.add_argument("costs", type=Path, help="analytic cost file or profiler profile")
    p.add_argument("cluster", type=Path, help="cluster file (JSON/YAML)")
    p.add_argument("--out", type=Path, default=Path("plan.json"), help="plan JSON to write")
    # A str, not a Path: Path("") is "." and would not read as "skip".
    p.add_argument("--gantt", default="plan.png",
                   help="Gantt chart PNG of the best plan ('' to skip)")
    p.add_argument("--top", type=int, default=5, help="plans to list")
    p.add_argument("--max-chunks", type=int, default=16,
                   help="most micro-batches per component's batch")
    p.add_argument("--exhaustive", action="store_true",
                   help="search every placement (small clusters only)")
    p.add_argument("--progress-every", type=float, default=PROGRESS_EVERY_S,
                   metavar="SECONDS",
                   help="print where a long search stands on stderr this often")
    return p


def _print_progress(progress: PlanProgress) -> None:
    print(f"planning {progress.line()}", file=sys.stderr, flush=True)


def format_table(result: PlanResult) -> str:
    """The ranked plans and the fixed-mode baselines as a text table."""
    best = result.best.predicted_time
    lines = [f"{'#':>2} {'mode':<13} {'iter s':>10} {'util':>5} {'vs best':>8}  placement | "
             "micro-batches | cuts of trainers (tensor, pipeline, data parallel; sequence "
             "parallel, distributed optimizer)"]

    def row(tag: str, p: ExecutionPlan) -> str:
        mb = ",".join(f"{k}={v}" for k, v in p.micro_batch.items())
        cuts = "".join(f" | {k}: {format_cut(c)}" for k, c in p.parallelism.items())
        # Costs of zero are valid (a free component): a zero-second best is 1x of itself.
        ratio = p.predicted_time / best if best > 0 else 1.0 if p.predicted_time == 0 else math.inf
        return (f"{tag:>2} {p.mode.value:<13} {p.predicted_time:>10.3f} {p.utilisation:>5.0%} "
                f"{ratio:>7.2f}x  {p.spec} | {mb}{cuts}")

    lines += [row(str(i + 1), p) for i, p in enumerate(result.ranked)]
    for kind, p in result.baselines.items():
        lines.append(row("-", p) + f"   (best {kind})")
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of ``rlinf-plan``."""
    args = _parser().parse_args(argv)
    try:
        workflow = Workflow.from_file(args.workflow)
        cost = load_cost_model(args.costs)
        cluster = Cluster.from_file(args.cluster)
        if args.top < 1 or args.max_chunks < 1:
            raise SchedError("--top and --max-chunks must be >= 1")
        if args.exhaustive:
            result = exhaustive_search(workflow, cost, cluster, max_chunks=args.max_chunks,
                                       keep=args.top)
        else:
            options = PlannerOptions(max_chunks=args.max_chunks, keep=args.top,
                                     progress_every=args.progress_every)
            result = plan(workflow, cost, cluster, options=options, progress=_print_progress)
        print(f"{workflow.name or args.workflow.name}: {len(workflow.components)} components "
              f"on {cluster.num_devices} devices ({result.evaluated} simulations, "
              f"{result.seconds:.2f} s)")
        print(format_table(result))
        result.save(args.out)
        print(f"plan written to {args.out}")
        if args.gantt:
            best = result.best
            sim = simulate(workflow, best.placement, cost, cluster,
                           micro_batch=best.micro_batch, record=True)
            from rlinf.sched.gantt import plot_gantt

            plot_gantt(sim, Path(args.gantt), num_devices=cluster.num_devices,
                       components=workflow.names,
                       title=f"{workflow.name}: {best.spec} — {sim.iteration_time:.3g} s/iter")
            print(f"gantt chart written to {args.gantt}")
    except (SchedError, OSError) as exc:
        # One line: YAML parse errors, for one, span several.
        message = " ".join(line.strip() for line in str(exc).splitlines() if line.strip())
        print(f"rlinf-plan: error: {message}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
