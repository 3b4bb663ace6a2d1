"""Transitional alias of `rlinf.sched.execution_plan`; do not import it in new code.

The module holding `ExecutionPlan` and `PlanResult` was renamed because ``rlinf.sched.plan``
is the planner function. This alias keeps ``rlinf.sched.planner`` importing while that
package moves to ``rlinf.sched.execution_plan``; delete it then (scripts/check_imports.py
reports it until it is gone).
"""

from rlinf.sched.execution_plan import PLAN_FORMAT, ExecutionPlan, PlanResult

__all__ = ["PLAN_FORMAT", "ExecutionPlan", "PlanResult"]
