"""The arithmetic of `bench_reasoning.py`: per-run medians, speedups and prediction errors.

Pure Python (no torch, no Ray) so it can be unit-tested on its own
(`benchmarks/tests/test_reasoning_summary.py`).
"""

from __future__ import annotations

import statistics
from collections.abc import Sequence
from dataclasses import dataclass, field

__all__ = ["BOUNDS", "RunResult", "check_bounds", "format_table", "merge_rounds", "summarize"]

BOUNDS = {"speedup_vs_trl": (">=", 1.5), "speedup_vs_trl_hf": (">=", 1.2),
          "max_prediction_error": ("<=", 0.15)}
"""The targets the verdict is checked against, on the default setting and on any other."""


@dataclass(frozen=True)
class RunResult:
    """Timed iterations of one contender (TRL, or one rlinf placement mode and engine)."""

    name: str
    """Row label, e.g. ``"rlinf collocated (hf)"``."""
    system: str
    """``"trl"`` or ``"rlinf"``."""
    engine: str
    """Rollout engine: ``"hf"`` or ``"vllm"``."""
    seconds: Sequence[float]
    """Wall seconds of each timed iteration (warm-up excluded)."""
    samples: Sequence[int]
    """Generated responses of each timed iteration."""
    tokens: Sequence[int]
    """Generated response tokens of each timed iteration."""
    placement: str = ""
    """rlinf: the placement spec; TRL: empty."""
    predicted: float | None = None
    """rlinf: the planner's predicted seconds per iteration for this placement."""
    extra: dict[str, float] = field(default_factory=dict)
    """Anything else worth printing (per-component medians, ...)."""
    cpu_seconds: Sequence[float] = ()
    """CPU-seconds of each timed iteration, over every process of the contender (empty: not
    measured)."""
    rounds: int = 1
    """Interleaved rounds the iterations come from (`merge_rounds`)."""

    def __post_init__(self) -> None:
        if not self.seconds or not (len(self.seconds) == len(self.samples) == len(self.tokens)):
            raise ValueError(f"{self.name}: need one or more timed iterations with seconds, "
                             f"samples and tokens each; got {len(self.seconds)}, "
                             f"{len(self.samples)}, {len(self.tokens)}")
        if self.cpu_seconds and len(self.cpu_seconds) != len(self.seconds):
            raise ValueError(f"{self.name}: {len(self.cpu_seconds)} CPU times for "
                             f"{len(self.seconds)} iterations")
        if any(s <= 0 for s in self.seconds):
            raise ValueError(f"{self.name}: iteration times must be > 0, got {self.seconds}")

    @property
    def seconds_per_iteration(self) -> float:
        """Median wall seconds of one iteration."""
        return float(statistics.median(self.seconds))

    @property
    def samples_per_s(self) -> float:
        """Median over iterations of responses per second."""
        return float(statistics.median(n / s for n, s in zip(self.samples, self.seconds,
                                                              strict=True)))

    @property
    def tokens_per_s(self) -> float:
        """Median over iterations of response tokens per second."""
        return float(statistics.median(n / s for n, s in zip(self.tokens, self.seconds,
                                                              strict=True)))

    @property
    def cpu_seconds_per_sample(self) -> float | None:
        """Median over iterations of CPU-seconds per response (None: not measured)."""
        if not self.cpu_seconds:
            return None
        return float(statistics.median(c / n for c, n in zip(self.cpu_seconds, self.samples,
                                                             strict=True)))

    @property
    def prediction_error(self) -> float | None:
        """``|predicted - measured| / measured`` of the median iteration (None: no prediction)."""
        if self.predicted is None:
            return None
        measured = self.seconds_per_iteration
        return abs(self.predicted - measured) / measured


def merge_rounds(results: Sequence[RunResult]) -> list[RunResult]:
    """One result per contender name, in first-seen order: the timed iterations of all its
    rounds pooled (medians are then over every round's iterations); the last prediction
    and extras kept."""
    merged: dict[str, RunResult] = {}
    for r in results:
        seen = merged.get(r.name)
        if seen is None:
            merged[r.name] = r
            continue
        if bool(seen.cpu_seconds) != bool(r.cpu_seconds):
            raise ValueError(f"{r.name}: CPU times measured in some rounds only")
        merged[r.name] = RunResult(
            name=r.name, system=r.system, engine=r.engine,
            seconds=[*seen.seconds, *r.seconds], samples=[*seen.samples, *r.samples],
            tokens=[*seen.tokens, *r.tokens], placement=r.placement,
            predicted=r.predicted if r.predicted is not None else seen.predicted,
            extra=r.extra or seen.extra, cpu_seconds=[*seen.cpu_seconds, *r.cpu_seconds],
            rounds=seen.rounds + r.rounds)
    return list(merged.values())


def check_bounds(verdict: dict[str, object]) -> dict[str, bool | None]:
    """Each of `BOUNDS` met (None: the figure is missing)."""
    met: dict[str, bool | None] = {}
    for key, (op, bound) in BOUNDS.items():
        value = verdict.get(key)
        met[key] = None if not isinstance(value, float) else (
            value >= bound if op == ">=" else value <= bound)
    return met


def summarize(results: Sequence[RunResult]) -> dict[str, object]:
    """The benchmark's verdict: ``speedup_vs_trl`` (best rlinf run, any engine, over the best
    TRL run, in samples/s), ``speedup_vs_trl_hf`` (best rlinf run with HF rollout over TRL),
    ``max_prediction_error`` (worst over the rlinf runs that carry a prediction), plus the
    names of the best runs. A speedup is None when either side is missing."""
    trl = [r for r in results if r.system == "trl"]
    ours = [r for r in results if r.system == "rlinf"]
    ours_hf = [r for r in ours if r.engine == "hf"]
    baseline = max(r.samples_per_s for r in trl) if trl else None  # TRL's best setting

    def best(runs: Sequence[RunResult]) -> RunResult | None:
        return max(runs, key=lambda r: r.samples_per_s) if runs else None

    top, top_hf = best(ours), best(ours_hf)
    errors = [e for r in ours if (e := r.prediction_error) is not None]
    fastest_trl = best(trl)
    verdict: dict[str, object] = {
        "speedup_vs_trl": (top.samples_per_s / baseline) if top and baseline else None,
        "speedup_vs_trl_hf": (top_hf.samples_per_s / baseline) if top_hf and baseline else None,
        "max_prediction_error": max(errors) if errors else None,
        "best": top.name if top else None,
        "best_hf": top_hf.name if top_hf else None,
        "best_trl": fastest_trl.name if fastest_trl else None,
        "trl_samples_per_s": baseline,
        "samples_per_s": {r.name: r.samples_per_s for r in results},
        "cpu_seconds_per_sample": {r.name: r.cpu_seconds_per_sample for r in results},
    }
    verdict["bounds_met"] = check_bounds(verdict)
    return verdict


def format_table(results: Sequence[RunResult]) -> str:
    """One row per run: samples/s, tokens/s, s/iteration, CPU-seconds per sample, predicted
    s/iteration and error."""
    header = (f"{'run':34s} {'samples/s':>10s} {'tokens/s':>10s} {'s/iter':>8s} "
              f"{'cpu s/smp':>9s} {'predicted':>10s} {'error':>7s}  placement")
    lines = [header, "-" * len(header)]
    for r in results:
        predicted = f"{r.predicted:10.2f}" if r.predicted is not None else f"{'-':>10s}"
        error = r.prediction_error
        err = f"{error:7.1%}" if error is not None else f"{'-':>7s}"
        cpu = r.cpu_seconds_per_sample
        cpu_text = f"{cpu:9.4f}" if cpu is not None else f"{'-':>9s}"
        lines.append(f"{r.name:34s} {r.samples_per_s:10.1f} {r.tokens_per_s:10.1f} "
                     f"{r.seconds_per_iteration:8.2f} {cpu_text} {predicted} {err}  "
                     f"{r.placement}")
    return "\n".join(lines)
