"""Both apps in every placement mode and ``auto``: is the plan the planner prices what runs?

For each app (``rlinf-reasoning``: GRPO on math with the tiny warm-start model;
``rlinf-embodied``: PPO on MuJoCo) and each setting (reasoning: prompts per step, group size,
response length; embodied: task, envs, rollout length), the app's CLI runs as a subprocess in
every fixed placement it offers (collocated, hybrid, disaggregated) and in ``auto``, the modes
of one setting back to back (interleaved: the order rotates from setting to setting, and with
``--rounds`` from round to round). Each run gets Hydra overrides and a temporary run folder,
and the benchmark reads its ``summary.json``:

- ``predicted_iteration_s``: the simulated iteration of the executed plan (``auto``: the plan
  it chose; fixed placements are priced too: reasoning's ``run.predict``, embodied's
  ``run.trace``, which every embodied run here sets so the modes run alike);
- ``measured_iteration_s``: the median over the run's steady iterations (the first left out);
- ``lock_switches_per_iteration``: the device lock's onloads per steady iteration, summed over
  every worker process; ``simulated_switches``: the switches of the simulation that gave the
  prediction.

The runs share one profile cache (``RLINF_PROFILE_CACHE``), empty when the benchmark starts:
each run adds what it measured of itself, and a run of a setting that ran before is priced
(and ``auto`` planned) from it, as a user's runs are.

Each CLI runs as a user's run on one machine does: its workers are local processes, no Ray
(``--ray``: every CLI connects, ``RAY_ADDRESS``, to one Ray instance the benchmark starts, so
no run pays for starting Ray; Ray's workers then run at nice 0 like the drivers,
``RAY_worker_niceness``, so a profile taken in a driver and the workers it predicts see the
same share of a loaded machine).
Before each run the benchmark waits (``--settle``, at most 30 s) until one second of the
machine's CPU is at most 15% busy: the previous run's processes (Ray workers exiting, a driver
writing its outputs) would otherwise overlap the next run's profile, which prices its plan.
The load average is recorded at the start and the end.

Prints a table (app, setting, mode, predicted and measured s/iter, relative error, switches
per iteration by the lock and simulated, the placement run); the last line is one JSON
object: ``auto_vs_best_fixed`` (max over settings of auto's measured s/iter over the best
fixed mode's), ``max_prediction_error`` (max |predicted - measured| / measured over every run),
``lock_matches_simulator`` (every run's lock switches equal its simulated switches), plus
``load_average``, per-setting ratios and counts.

Launch: ``tox -e bench-flow`` (3 settings per app, 3 rounds: a plan's median run moves by
a fifth from run to run on a loaded 2-core machine, so one round cannot tell a 5% bound), or
``tox -e bench-flow -- --quick`` (one small setting per app, 3 steps: a smoke run).
``--settings`` picks settings by name, ``--setting APP KEY=VALUE ...`` adds one of your own
(the app's Hydra overrides, on top of the common ones; repeatable, and then only the named
built-in settings run), ``--modes`` the modes, ``--steps`` and
``--iterations`` the run lengths, ``--keep-runs DIR`` keeps each run's folder to read later.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from contextlib import AbstractContextManager
from dataclasses import dataclass
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from flow_summary import FIXED_MODES, FlowRun, format_table, summarize
from quiet import wait_for_idle_cores

from rlinf.workers.runtime.ray_session import local_ray_instance

MODES = (*FIXED_MODES, "auto")


@dataclass(frozen=True)
class Setting:
    """One workload of one app: a name and the Hydra overrides that make it."""

    app: str
    name: str
    overrides: tuple[str, ...]


REASONING_COMMON = ("data.heldout_size=16", "run.eval_every=0", "run.checkpoint_every=0",
                    "run.loggers=[jsonl]", "run.log_level=warning")
"""Every reasoning run: no evaluation between steps, no TensorBoard, a small held-out set."""

REASONING_MODES = {
    "collocated": ("placement=collocated", "cluster.cpu_slots=2"),
    "hybrid": ("placement=hybrid", "cluster.cpu_slots=2"),
    # One slot each for reward and inference, one for rollout and one for the actor.
    "disaggregated": ("placement=disaggregated", "cluster.cpu_slots=4"),
    "auto": ("placement=auto",),  # its cluster.cpu_slots: --auto-slots
}
AUTO_SLOTS = 4
"""Reasoning ``auto``'s logical CPU slots by default: the most any fixed mode gets
(disaggregated's 4), so that every fixed plan is in its search space; the planner's
core-sharing model prices what sharing the 2 cores costs."""

EMBODIED_COMMON = ("run.eval_every=0", "run.checkpoint_every=0", "run.eval_episodes=1",
                   "env.max_episode_steps=200", "run.eval_max_steps=200", "run.video=false",
                   "run.trace=true", "algorithm.epochs=4", "algorithm.num_minibatches=4")
"""Every embodied run: one short evaluation, no video; traced, so fixed placements are
priced (a profile taken on the launched flow) and every mode runs with the same recording."""

EMBODIED_MODES = {mode: (f"placement={mode}",) for mode in MODES}
"""Each placement group's own device count (collocated 1, hybrid 2, disaggregated 3, auto 2)."""

SETTINGS = (
    Setting("reasoning", "p16-g8-t8", ("data.prompts_per_step=16", "rollout.group_size=8",
                                       "rollout.max_new_tokens=8",
                                       "rollout.groups_per_micro_batch=4",
                                       "run.profile_batches=[4,16]")),
    Setting("reasoning", "p32-g4-t8", ("data.prompts_per_step=32", "rollout.group_size=4",
                                       "rollout.max_new_tokens=8",
                                       "rollout.groups_per_micro_batch=8",
                                       "run.profile_batches=[8,32]")),
    Setting("reasoning", "p16-g4-t24", ("data.prompts_per_step=16", "rollout.group_size=4",
                                        "rollout.max_new_tokens=24",
                                        "rollout.groups_per_micro_batch=4",
                                        "run.profile_batches=[4,16]")),
    Setting("embodied", "idp-e16-s64", ("task=inverted_double_pendulum", "env.num_envs=16",
                                        "run.rollout_steps=64")),
    Setting("embodied", "idp-e32-s32", ("task=inverted_double_pendulum", "env.num_envs=32",
                                        "run.rollout_steps=32")),
    Setting("embodied", "ip-e8-s128", ("task=inverted_pendulum", "env.num_envs=8",
                                       "run.rollout_steps=128")),
)
"""The full benchmark's settings (the first of each app is the one ``--quick`` shrinks)."""

QUICK = (
    Setting("reasoning", "quick", ("data.prompts_per_step=4", "rollout.group_size=4",
                                   "rollout.max_new_tokens=4",
                                   "rollout.groups_per_micro_batch=2",
                                   "run.profile_batches=[2,4]",
                                   "algorithm.micro_batch_size=16")),
    Setting("embodied", "quick", ("env.num_envs=4", "run.rollout_steps=16",
                                  "policy.hidden_sizes=[16,16]")),
)

def own_setting(words: Sequence[str], index: int) -> Setting:
    """A ``--setting APP KEY=VALUE ...``: its app and overrides, named by them."""
    app, *overrides = words
    if app not in ("reasoning", "embodied"):
        raise ValueError(f"--setting starts with the app, reasoning or embodied, got {app!r}")
    if not overrides or any("=" not in o or o.startswith("=") for o in overrides):
        raise ValueError(f"--setting {app} needs Hydra overrides KEY=VALUE after the app, "
                         f"got {overrides}")
    return Setting(app, f"own{index}", tuple(overrides))


def _env() -> dict[str, str]:
    return {**os.environ, "RAY_AUTH_MODE": "disabled", "RAY_USAGE_STATS_ENABLED": "0",
            "TOKENIZERS_PARALLELISM": "false", "RAY_worker_niceness": "0"}


def runtime(use_ray: bool) -> AbstractContextManager[str]:
    """Where the runs' workers go for the benchmark's lifetime: with `use_ray` a local Ray
    instance owned by a helper process (yields its GCS address), else local processes of
    each run (yields "")."""
    return local_ray_instance(env=_env()) if use_ray else contextlib.nullcontext("")


def command(setting: Setting, mode: str, *, steps: int, iterations: int,
            run_dir: Path, common: Sequence[str] | None = None,
            auto_slots: int = AUTO_SLOTS) -> list[str]:
    """The CLI command line of one run (`common` replaces the app's shared overrides)."""
    if setting.app == "reasoning":
        slots = (f"cluster.cpu_slots={auto_slots}",) if mode == "auto" else ()
        return [sys.executable, "-m", "rlinf_reasoning.cli", *(common or REASONING_COMMON),
                *setting.overrides, *REASONING_MODES[mode], *slots, f"run.steps={steps}",
                "--run-dir", str(run_dir)]
    return [sys.executable, "-m", "rlinf_embodied.cli", *(common or EMBODIED_COMMON),
            *setting.overrides, *EMBODIED_MODES[mode], f"run.iterations={iterations}",
            "--run-dir", str(run_dir)]


def run_once(setting: Setting, mode: str, *, steps: int, iterations: int, ray_address: str,
             workdir: Path, timeout: float, common: Sequence[str] | None = None,
             auto_slots: int = AUTO_SLOTS) -> tuple[FlowRun, float]:
    """One CLI run (on the Ray instance at `ray_address`; "": its own local processes); its
    row (an ``error`` when it gave no summary) and its wall seconds."""
    run_dir = Path(tempfile.mkdtemp(prefix=f"{setting.app}-{setting.name}-{mode}-",
                                    dir=workdir))
    cmd = command(setting, mode, steps=steps, iterations=iterations, run_dir=run_dir,
                  common=common, auto_slots=auto_slots)
    started = time.perf_counter()
    try:
        env = {**_env(), "RAY_ADDRESS": ray_address}
        if not ray_address:
            del env["RAY_ADDRESS"]
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, env=env,
                              check=False)
    except subprocess.TimeoutExpired:
        return (FlowRun(setting.app, setting.name, mode, error=f"timed out after {timeout:g} s"),
                time.perf_counter() - started)
    seconds = time.perf_counter() - started
    summary = run_dir / "summary.json"
    if proc.returncode != 0 or not summary.is_file():
        lines = proc.stderr.strip().splitlines()
        print(f"# {setting.app}/{setting.name}/{mode} failed: {' '.join(cmd[1:])}\n#   "
              + "\n#   ".join(lines[-25:]), file=sys.stderr, flush=True)
        errors = [line for line in lines if "Error" in line] or lines or [""]
        return (FlowRun(setting.app, setting.name, mode,
                        error=f"exit {proc.returncode}: {errors[-1].strip()[:160]}"), seconds)
    data = json.loads(summary.read_text())
    return FlowRun.from_summary(setting.app, setting.name, mode, data), seconds


def _rotated(modes: Sequence[str], by: int) -> list[str]:
    k = by % len(modes)
    return [*modes[k:], *modes[:k]]


def _load() -> float:
    return round(os.getloadavg()[0], 2)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true",
                        help="one small setting per app and 3 steps (a smoke run)")
    parser.add_argument("--apps", default="reasoning,embodied",
                        help="comma-separated apps to run (default: both)")
    parser.add_argument("--settings", default="",
                        help="comma-separated setting names (default: all of the chosen apps; "
                             f"known: {', '.join(s.name for s in SETTINGS)})")
    parser.add_argument("--setting", nargs="+", action="append", default=[],
                        metavar=("APP", "KEY=VALUE"),
                        help="a setting of your own: the app (reasoning or embodied) and its "
                             "Hydra overrides, e.g. --setting reasoning "
                             "data.prompts_per_step=24 rollout.group_size=6; repeatable. "
                             "Given, these run instead of the built-in settings (add built-in "
                             "ones by name with --settings)")
    parser.add_argument("--modes", default=",".join(MODES),
                        help="comma-separated modes (default: every fixed mode and auto)")
    parser.add_argument("--steps", type=int, default=None,
                        help="reasoning steps per run (default 12; --quick 3): the measured "
                             "s/iter is the median of all but the first")
    parser.add_argument("--iterations", type=int, default=None,
                        help="embodied iterations per run (default 12; --quick 3)")
    parser.add_argument("--rounds", type=int, default=None,
                        help="runs per setting and mode, interleaved (the median measured run "
                             "is kept; default 3, --quick 1)")
    parser.add_argument("--auto-slots", type=int, default=AUTO_SLOTS,
                        help="reasoning auto's cluster.cpu_slots (default 4: the most a fixed "
                             "mode gets, so every fixed plan is one auto may choose)")
    parser.add_argument("--settle", type=float, default=30.0, metavar="SECONDS",
                        help="before each run, wait up to this long for one second of the "
                             "machine's CPU at most 15%% busy (0: do not wait)")
    parser.add_argument("--timeout", type=float, default=900.0,
                        help="seconds one run may take before it counts as failed")
    parser.add_argument("--ray", action="store_true",
                        help="run every CLI on one shared Ray instance (default: each run's "
                             "workers are local processes, as a run on one machine)")
    parser.add_argument("--keep-runs", type=Path, default=None, metavar="DIR",
                        help="keep every run's folder (metrics.jsonl, summary.json, trace) "
                             "under DIR instead of a temporary folder removed at the end")
    args = parser.parse_args(argv)

    apps = [a.strip() for a in args.apps.split(",") if a.strip()]
    modes = [m.strip() for m in args.modes.split(",") if m.strip()]
    unknown = sorted(set(modes) - set(MODES))
    if unknown:
        parser.error(f"unknown modes {unknown}: expected some of {list(MODES)}")
    pool = QUICK if args.quick else SETTINGS
    names = {n.strip() for n in args.settings.split(",") if n.strip()}
    try:
        custom = [own_setting(words, index) for index, words in enumerate(args.setting)]
    except ValueError as exc:
        parser.error(str(exc))
    chosen = (lambda s: s.name in names) if names else (lambda s: not custom)
    settings = [s for s in pool if s.app in apps and chosen(s)]
    settings += [s for s in custom if s.app in apps]
    if not settings:
        parser.error(f"no setting matches apps={apps} settings={sorted(names)}")
    if args.settle < 0:
        parser.error(f"--settle must be >= 0 seconds, got {args.settle}")
    if args.auto_slots < 1:
        parser.error(f"--auto-slots must be >= 1, got {args.auto_slots}")
    if args.rounds is not None and args.rounds < 1:
        parser.error(f"--rounds must be >= 1, got {args.rounds}")
    rounds = args.rounds or (1 if args.quick else 3)
    steps = args.steps or (3 if args.quick else 12)
    iterations = args.iterations or (3 if args.quick else 12)

    load_start = _load()
    print(f"# bench-flow on {os.cpu_count()} cores, load average {load_start:.2f} at the "
          f"start; reasoning {steps} steps, embodied {iterations} iterations per run; "
          f"{rounds} round(s); modes {', '.join(modes)}; reasoning auto on "
          f"{args.auto_slots} CPU slots", flush=True)
    for s in settings:
        print(f"#   {s.app}/{s.name}: {' '.join(s.overrides)}", flush=True)

    rows: list[FlowRun] = []
    began = time.perf_counter()
    if args.keep_runs is not None:
        args.keep_runs.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="bench-flow-") as scratch, \
            runtime(args.ray) as address:
        workdir = str(args.keep_runs or scratch)
        # One profile cache for the benchmark's runs, empty at its start (never the user's):
        # each run adds what it measured and prices itself from what the runs before cached.
        os.environ["RLINF_PROFILE_CACHE"] = str(Path(workdir) / "profiles")
        for index, setting in enumerate(settings):
            runs: dict[str, list[FlowRun]] = {m: [] for m in modes}
            for round_ in range(rounds):
                for mode in _rotated(modes, index + round_):
                    settled = wait_for_idle_cores(0.15, args.settle) if args.settle else 0.0
                    row, seconds = run_once(setting, mode, steps=steps, iterations=iterations,
                                            ray_address=address, workdir=Path(workdir),
                                            timeout=args.timeout, auto_slots=args.auto_slots)
                    runs[mode].append(row)
                    status = row.error or (f"measured {row.measured or float('nan'):.3f} s/iter, "
                                           f"predicted {row.predicted or float('nan'):.3f}")
                    print(f"# {setting.app}/{setting.name}/{mode}: {status} ({seconds:.0f} s "
                          f"run after {settled:.0f} s settling, load {_load():.2f})", flush=True)
            for mode in modes:
                done = sorted((r for r in runs[mode] if not r.error),
                              key=lambda r: r.measured or 0.0)
                rows.append(done[len(done) // 2] if done else runs[mode][0])
    load_end = _load()
    print(f"# {time.perf_counter() - began:.0f} s in all; load average {load_end:.2f} at the "
          "end")
    print(format_table(rows))
    verdict = summarize(rows, load_average={"start": load_start, "end": load_end})
    verdict["targets"] = {"auto_vs_best_fixed": 1.05, "max_prediction_error": 0.15,
                          "lock_matches_simulator": True}
    print(json.dumps(verdict))
    return 0


if __name__ == "__main__":
    sys.exit(main())
