"""The M2Flow planner: search placements and micro-batch granularity, scored by simulation.

`plan` is the entry point (exact on small clusters, a bounded coarse-to-fine search on large
ones); `exhaustive_search` is the brute-force reference used by tests and the benchmark.
"""

from rlinf.sched.planner.exhaustive import exhaustive_candidates, exhaustive_search
from rlinf.sched.planner.search import SPAN, BlockLayout, PlannerOptions, block_layouts, plan
from rlinf.sched.planner.space import Candidate, Evaluator, Scored, chunk_choices

__all__ = [
    "SPAN",
    "BlockLayout",
    "Candidate",
    "Evaluator",
    "PlannerOptions",
    "Scored",
    "block_layouts",
    "chunk_choices",
    "exhaustive_candidates",
    "exhaustive_search",
    "plan",
]
