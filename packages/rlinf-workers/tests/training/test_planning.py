"""What a cached profile is keyed by (`profile_identity`), and how a run ranks plans."""

from __future__ import annotations

import io
from importlib import metadata
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from rlinf.workers.flow.auto import PROFILE_FORMAT
from rlinf.workers.training import profile_identity


def test_the_identity_holds_the_config_the_versions_installed_and_the_formats() -> None:
    identity = profile_identity({"model.width": 8}, distributions=("torch", "no-such-dist"),
                                probes=2)
    assert identity == {"config": {"model.width": 8},
                        "versions": {"torch": metadata.version("torch")},
                        "profile_format": PROFILE_FORMAT, "probes": 2}
    assert profile_identity({"model.width": 16}, distributions=()) != \
        profile_identity({"model.width": 8}, distributions=())


def test_the_first_guess_collocates_on_no_more_cpu_slots_than_cores() -> None:
    from rlinf.sched import Cluster
    from rlinf.workers.training import collocated_devices

    assert collocated_devices(Cluster.uniform(1, 4, "8GiB", "cpu", cpus_per_node=2)) == 2
    assert collocated_devices(Cluster.uniform(1, 2, "8GiB", "cpu", cpus_per_node=8)) == 2
    assert collocated_devices(Cluster.uniform(1, 4, "8GiB", "cpu")) == 4  # cores unknown
    assert collocated_devices(Cluster.uniform(1, 8, "80GiB", "H100", cpus_per_node=2)) == 8


def test_rank_budgets_the_search_to_a_share_of_the_run_and_prints_progress(
        tmp_path: Path) -> None:
    from rlinf.sched import PlanProgress
    from rlinf.workers.training import Pricing, RunSettings
    from rlinf.workers.training.planning import MIN_SEARCH_SECONDS, PLANNING_SHARE, rank

    from .test_pricing import BOX, COSTS, FLOW, plan_of

    seen: dict[str, Any] = {}

    class Recording(Pricing):
        def rank(self, costs: Any, cluster: Any, *, options: Any = None,
                 progress: Any = None) -> Any:
            seen["options"], seen["progress"] = options, progress
            if progress is not None:
                progress(PlanProgress("exact", 5000, 3.2, 0.1234))
            return super().rank(costs, cluster, options=options)

    guess = plan_of("source,sink: 0-1")
    task = SimpleNamespace(pricing=Recording(FLOW.to_sched_workflow()),
                           settings=RunSettings(run_dir=tmp_path, steps=7, unit="episode"),
                           first_guess=lambda cluster: guess)
    out = io.StringIO()
    choice = rank(task, COSTS, BOX, steps=40, out=out)  # type: ignore[arg-type]
    priced, _ = task.pricing.price(guess, COSTS, BOX)
    assert seen["options"].exact_seconds == pytest.approx(
        PLANNING_SHARE * 40 * priced.predicted_time)
    assert seen["options"].search_seconds == pytest.approx(max(
        MIN_SEARCH_SECONDS, PLANNING_SHARE * 40 * priced.predicted_time))
    assert out.getvalue() == ("auto: still planning (exact): 5000 simulations in 3 s, the best "
                              "so far 0.123 s per episode\n")
    assert choice.ranked is not None
    # The re-planner's ranking prints nothing.
    rank(task, COSTS, BOX, steps=40, out=None)  # type: ignore[arg-type]
    assert seen["progress"] is None
