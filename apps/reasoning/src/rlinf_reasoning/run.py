"""The reasoning app's part of a training run: `ReasoningTask` for the library's runner
(`rlinf.workers.training.train`), which resumes, plans, launches, loops, checkpoints and
restarts.

    config → problems (pure function of seed and step) → FlowSpec → the runner:
    plan (a fixed placement, or auto; priced from the profile cache or the run's first
    steps) → launch → held-out greedy accuracy before → steps → held-out accuracy every
    `eval_every` → checkpoint every `checkpoint_every` (and a Hugging Face export with
    ``run.export_hf``) → learning curve, trace, summary
"""

from __future__ import annotations

import dataclasses
import functools
import json
import math
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any, TextIO

import structlog

from rlinf.sched import Cluster, ExecutionMode, ExecutionPlan, Profile
from rlinf.workers.telemetry import Span, write_run_trace
from rlinf.workers.training import (
    PlanChoice,
    RunOutcome,
    RunSettings,
    collocated_devices,
)
from rlinf.workers.training import dry_run as run_dry
from rlinf.workers.training import profile_identity as identity_of
from rlinf.workers.training import train as run_training
from rlinf_reasoning.banner import describe_loaded
from rlinf_reasoning.config import LENGTH_KEYS, ReasoningConfig, component_names, config_dict
from rlinf_reasoning.data import problem_source
from rlinf_reasoning.export import export_checkpoint
from rlinf_reasoning.flow import ReasoningFlow, StepResult
from rlinf_reasoning.placement import resolve_placement
from rlinf_reasoning.pricing import ReasoningPricing, profile_spec
from rlinf_reasoning.report import HELDOUT_KEY, Summary, write_curve
from rlinf_reasoning.spec import FlowSpec, flow_spec
from rlinf_reasoning.workflow import fixed_plan

__all__ = ["HF_EXPORT_DIR", "SAMPLES_FILE", "ReasoningTask", "dry_run", "profile_identity",
           "train"]

_log = structlog.get_logger(__name__)

HF_EXPORT_DIR = "hf"
"""Folder of the Hugging Face exports of checkpoints (``run.export_hf``)."""
SAMPLES_FILE = "samples.jsonl"
"""Held-out responses of each evaluation, one JSON object per line (``run.eval_samples``)."""
PROGRESS_KEYS = ("reward/accuracy", HELDOUT_KEY, "time/step")
TOOL_EVAL_PREFIX = "eval/tool_"


def profile_identity(cfg: ReasoningConfig) -> dict[str, object]:
    """What a component's cost depends on besides the workflow and the cluster
    (`rlinf.workers.training.profile_identity`): every setting but the run's (jobs of a
    sweep over seeds share one profile)."""
    flat = {k: v for k, v in config_dict(cfg).items() if not k.startswith("run.")}
    return identity_of(flat, distributions=("torch", "transformers"))


def run_settings(cfg: ReasoningConfig) -> RunSettings:
    """The runner's settings of `cfg`'s ``run`` section and placement."""
    run = cfg.run
    return run.settings(
        steps=run.steps, auto=cfg.placement.strip().lower() == "auto", predict=run.predict,
        replan=run.replan, replan_threshold=run.replan_threshold,
        replan_patience=run.replan_patience, unit="step", progress_desc="train",
        progress_keys=PROGRESS_KEYS)


class ReasoningTask:
    """`rlinf.workers.training.TrainingTask` of a reasoning run."""

    resumable_keys = LENGTH_KEYS

    def __init__(self, cfg: ReasoningConfig) -> None:
        self.cfg = cfg
        self.settings = run_settings(cfg)
        self.spec: FlowSpec = flow_spec(cfg)
        self.source = problem_source(cfg)

    # -- configuration --------------------------------------------------------------------------
    def config(self) -> dict[str, Any]:
        return config_dict(self.cfg)

    def default_config(self) -> dict[str, Any]:
        return config_dict(ReasoningConfig())

    def announce(self, out: TextIO) -> None:
        for line in describe_loaded(self.cfg, self.spec, self.source).lines():
            print(line, file=out)

    def ray_options(self) -> dict[str, Any]:
        return {}

    def cluster(self) -> Cluster:
        return Cluster.discover(use_ray=True, cpu_slots=self.cfg.cluster.cpu_slots)

    # -- planning -----------------------------------------------------------------------------
    @functools.cached_property
    def pricing(self) -> ReasoningPricing:
        return ReasoningPricing(self.spec)

    def profile_identity(self) -> dict[str, object]:
        return profile_identity(self.cfg)

    def fixed_plan(self, cluster: Cluster, placement: str | None = None) -> ExecutionPlan:
        """The unpriced plan of the configured placement (or `placement`) on `cluster`."""
        placed = resolve_placement(placement or self.cfg.placement, component_names(self.cfg),
                                   cluster.num_devices)
        return fixed_plan(self.spec, placed.to_spec(), num_devices=cluster.num_devices,
                          granularity_groups=self.cfg.rollout.groups_per_micro_batch)

    def first_guess(self, cluster: Cluster) -> ExecutionPlan:
        """Every component collocated (`rlinf.workers.training.collocated_devices`); with
        ``actor.cut=auto`` the data-parallel cut, the one a profile is measured with."""
        devices = collocated_devices(cluster)
        placed = resolve_placement("collocated", component_names(self.cfg), devices)
        plan = self.fixed_plan(cluster, placed.to_spec())
        if not self.spec.choose_cut:
            return plan
        cut = {"tensor": 1, "pipeline": 1, "data": devices, "sequence_parallel": 0,
               "distributed_optimizer": 0}
        return dataclasses.replace(plan, parallelism={**plan.parallelism, "actor": cut})

    def compatible(self, current: ExecutionPlan, candidate: ExecutionPlan) -> bool:
        """Always: a reasoning checkpoint loads into any placement."""
        return True

    def profile(self, cluster: Cluster) -> Profile:
        """`profile_spec` at each `run.profile_batches` size, with the pipelined probe unless
        the placement is collocated (nothing it calibrates touches that price)."""
        cfg = self.cfg
        sizes = sorted({prompts * cfg.rollout.group_size for prompts in cfg.run.profile_batches})
        collocated = cfg.placement.strip().lower() != "auto" and \
            self.fixed_plan(cluster).mode is ExecutionMode.COLLOCATED
        return profile_spec(self.spec, cluster, batch_sizes=sizes, problems=self.source,
                            granularity_groups=cfg.rollout.groups_per_micro_batch,
                            pipeline_probe=not collocated)

    # -- the run ------------------------------------------------------------------------------
    def launch(self, plan: ExecutionPlan, cluster: Cluster) -> ReasoningFlow:
        return ReasoningFlow.launch(self.spec, plan, problems=self.source, cluster=cluster,
                                    trace=self.cfg.run.trace)

    def evaluate(self, flow: ReasoningFlow, step: int, *, final: bool) -> dict[str, float]:
        """Held-out greedy accuracy (and the tools' use); the first ``run.eval_samples``
        responses, with their rewards, appended to the run folder's `SAMPLES_FILE`."""
        evaluation = flow.evaluation(self.source.heldout, samples=self.cfg.run.eval_samples)
        if evaluation.samples:
            with (self.settings.run_dir / SAMPLES_FILE).open("a", encoding="utf-8") as out:
                for sample in evaluation.samples:
                    out.write(json.dumps({"step": step, **sample}) + "\n")
        return {HELDOUT_KEY: evaluation.accuracy,
                **{f"{TOOL_EVAL_PREFIX}{key}": value for key, value in evaluation.tools.items()}}

    def record(self, result: StepResult, *, counted: int) -> tuple[dict[str, float], int]:
        return ({**result.metrics, "rollout/samples": float(result.samples),
                 "rollout/tokens": float(result.tokens)}, result.samples)

    def checkpointed(self, step: int, path: Path) -> None:
        if self.cfg.run.export_hf:
            run_dir = self.settings.run_dir
            export_checkpoint(run_dir, run_dir / HF_EXPORT_DIR / f"step-{step:08d}", step=step)

    def write_outputs(self, records: Sequence[Mapping[str, float]], spans: Sequence[Span],
                      last_spans: Sequence[Span], choice: PlanChoice, *, out: TextIO) -> None:
        write_curve(records, self.settings.run_dir)
        if self.cfg.run.trace and spans:
            write_run_trace(self.settings.run_dir, spans, last_spans, choice.simulation)

    def summarize(self, outcome: RunOutcome) -> Summary:
        busy = sum(outcome.step_seconds)
        summary = Summary(
            **Summary.of_run(outcome, self.settings.run_dir),
            heldout_before=outcome.before.get(HELDOUT_KEY, math.nan),
            heldout_after=outcome.after.get(HELDOUT_KEY, math.nan),
            samples=outcome.counted, samples_per_s=outcome.counted / busy if busy else 0.0,
            parallelism=outcome.choice.plan.parallelism,
            tools_before=_tools(outcome.before), tools_after=_tools(outcome.after))
        summary.save(self.settings.run_dir)
        return summary

    def print_summary(self, summary: Summary, out: TextIO) -> None:
        print(summary.format(), file=out)
        _log.info("run_done", **summary.to_dict())


def _tools(evaluation: Mapping[str, float]) -> dict[str, float]:
    return {key.removeprefix(TOOL_EVAL_PREFIX): value for key, value in evaluation.items()
            if key.startswith(TOOL_EVAL_PREFIX)}


def train(cfg: ReasoningConfig, *, resume: bool = False, overrides: Sequence[str] = (),
          out: TextIO = sys.stdout, ray_started: bool = False) -> Summary:
    """Run (or resume) training as `cfg` says; prints and returns the summary
    (`rlinf.workers.training.train`: restarts, resume, live pricing)."""
    summary: Summary = run_training(ReasoningTask(cfg), resume=resume, overrides=overrides,
                                    out=out, ray_started=ray_started)
    return summary


def dry_run(cfg: ReasoningConfig, *, out: TextIO = sys.stdout) -> PlanChoice:
    """Print the plan the run would launch (`rlinf.workers.training.dry_run`)."""
    offline = Cluster.discover(use_ray=False, cpu_slots=cfg.cluster.cpu_slots)
    return run_dry(ReasoningTask(cfg), out=out, offline=offline)
