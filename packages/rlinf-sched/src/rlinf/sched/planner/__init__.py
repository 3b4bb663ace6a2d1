"""The M2Flow planner: search placements and micro-batch granularity, scored by simulation.

`plan` is the entry point (a bounded coarse-to-fine search, followed on small clusters by
exact branch and bound); `exhaustive_search` is the reference used by tests and the benchmark
(branch and bound, or with ``prune=False`` brute force). Both search contiguous ranges of
every device order of `device_orders` (non-contiguous sets on mixed clusters) and propose
only micro-batch sizes the runtime runs (`rlinf.sched.granularity`).
"""

from rlinf.sched.planner.branch import FIXED_MODES, BranchResult, branch_and_bound
from rlinf.sched.planner.exhaustive import exhaustive_candidates, exhaustive_search
from rlinf.sched.planner.orders import device_orders
from rlinf.sched.planner.progress import PlanProgress, ProgressCallback
from rlinf.sched.planner.search import SPAN, BlockLayout, PlannerOptions, block_layouts, plan
from rlinf.sched.planner.space import Candidate, Evaluator, Scored, chunk_choices

__all__ = [
    "FIXED_MODES",
    "SPAN",
    "BlockLayout",
    "BranchResult",
    "Candidate",
    "Evaluator",
    "PlanProgress",
    "PlannerOptions",
    "ProgressCallback",
    "Scored",
    "block_layouts",
    "branch_and_bound",
    "chunk_choices",
    "device_orders",
    "exhaustive_candidates",
    "exhaustive_search",
    "plan",
]
