"""``rlinf-reasoning`` end to end in a subprocess with a tiny budget (2 steps, 4 x 4, 4 tokens).

Every placement mode runs the real flow (Ray workers, channels, device lock, weight sync);
the same seed must give the same metrics in every mode, ``auto`` must try its best-priced
plans, launch the fastest and report its predicted and measured iteration times, and a run
killed with SIGKILL right after a checkpoint must, with ``--resume``, finish with the metrics
and weights of an uninterrupted run.
"""

from __future__ import annotations

import contextlib
import json
import math
import os
import shutil
import signal
import struct
import subprocess
import sys
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import psutil
import pytest
import torch
from rlinf_reasoning.report import format_fixed

pytestmark = pytest.mark.timeout(900)

TINY = (
    "run.steps=2", "data.prompts_per_step=4", "rollout.group_size=4",
    "rollout.max_new_tokens=4", "rollout.groups_per_micro_batch=2", "data.heldout_size=16",
    "run.profile_batches=[2,4]", "algorithm.micro_batch_size=16", "run.eval_every=1",
    "run.checkpoint_every=1", "run.log_level=warning",
)
"""2 steps of 4 prompts x 4 responses, 4 new tokens: every stage runs, in seconds."""


def cli_command(run_dir: Path, *overrides: str) -> list[str]:
    """The ``rlinf-reasoning`` command line of a tiny run in `run_dir`."""
    return [sys.executable, "-m", "rlinf_reasoning.cli", *TINY, *overrides,
            "--run-dir", str(run_dir)]


def cli_env(ray_address: str | None = None) -> dict[str, str]:
    """Environment of a CLI subprocess (one OpenMP thread per process; wandb offline and
    MLflow in the run folder whatever the machine's settings), connected to the Ray
    instance at `ray_address` when given (conftest's shared one), else starting its own."""
    env = {k: v for k, v in os.environ.items() if k not in ("MLFLOW_TRACKING_URI", "RAY_ADDRESS")}
    return {**env, "OMP_NUM_THREADS": "1", "WANDB_MODE": "offline",
            **({"RAY_ADDRESS": ray_address} if ray_address else {})}


def mlflow_run(run_dir: Path) -> tuple[Any, str]:
    """The MLflow client of a run folder's local store and the run's id."""
    from mlflow.tracking import MlflowClient

    # MLflow 3 refuses its (maintenance-mode) file store unless asked, readers included.
    os.environ.setdefault("MLFLOW_ALLOW_FILE_STORE", "true")
    client = MlflowClient(tracking_uri=(run_dir / "mlruns").resolve().as_uri())
    return client, (run_dir / ".mlflow-run-id").read_text().strip()


def run_cli(run_dir: Path, *overrides: str, timeout: float = 400,
            ray_address: str | None = None) -> subprocess.CompletedProcess[str]:
    """Run a tiny training run to completion (on the Ray instance at `ray_address` when
    given); fails the test with its output otherwise."""
    proc = subprocess.run(cli_command(run_dir, *overrides), capture_output=True, text=True,
                          timeout=timeout, env=cli_env(ray_address), check=False)
    if proc.returncode != 0:
        pytest.fail(f"rlinf-reasoning exited {proc.returncode}\nstdout:\n{proc.stdout}\n"
                    f"stderr:\n{proc.stderr[-4000:]}")
    return proc


def stable(record: Mapping[str, float]) -> dict[str, float]:
    """The metrics of a record that do not depend on timing."""
    return {k: v for k, v in record.items()
            if not k.startswith(("time", "throughput/")) and "seconds" not in k
            and not k.endswith("_per_s")}


def read_jsonl(path: Path) -> list[dict[str, float]]:
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def assert_same_metrics(a: Sequence[Mapping[str, float]], b: Sequence[Mapping[str, float]],
                        *, tol: float = 1e-4) -> None:
    """Same steps, same stable keys, values equal within `tol` (relative and absolute)."""
    assert [r["step"] for r in a] == [r["step"] for r in b]
    for ra, rb in zip(a, b, strict=True):
        sa, sb = stable(ra), stable(rb)
        assert sa.keys() == sb.keys(), (ra["step"], sorted(sa.keys() ^ sb.keys()))
        for k in sa:
            assert math.isclose(sa[k], sb[k], rel_tol=tol, abs_tol=tol), \
                f"step {ra['step']} {k}: {sa[k]} != {sb[k]}"


REFERENCE = ("placement=collocated", "cluster.cpu_slots=1", "run.trace=true",
             "run.export_hf=true", "run.loggers=[jsonl,tensorboard,wandb,mlflow]")
"""Overrides of the reference run (and of the run that is killed and resumed)."""


@pytest.fixture(scope="module")
def reference_profiles(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The profile cache of the reference run, which the killed-and-resumed runs of the
    same config reuse (profiling is a launch of its own)."""
    return tmp_path_factory.mktemp("reference-profiles")


@pytest.fixture(scope="module")
def reference_run(tmp_path_factory: pytest.TempPathFactory, reference_profiles: Path,
                  ray_address: str) -> tuple[Path, str]:
    """One collocated tiny run with the trace on; other tests compare against it.

    One CPU slot, so the actor has one rank as in the other modes' runs: a multi-rank actor
    averages per-rank loss means, which differs from one rank's batch mean in the last digits.
    """
    run_dir = tmp_path_factory.mktemp("reference") / "run"
    proc = run_cli(run_dir, *REFERENCE, f"run.profile_cache={reference_profiles}",
                   ray_address=ray_address)
    # Nothing profiled before the run: the plan is priced from its own steps, then cached.
    assert "predict: no profile of this workflow, model and cluster is cached: starting at " \
        "once" in proc.stdout, proc.stdout
    assert "(priced from the components this run measured in its first 2 step(s))" \
        in proc.stdout
    assert len(list(reference_profiles.glob("*.json"))) == 1
    return run_dir, proc.stdout


def test_outputs_are_well_formed(reference_run: tuple[Path, str]) -> None:
    run_dir, stdout = reference_run
    records = read_jsonl(run_dir / "metrics.jsonl")
    assert [r["step"] for r in records] == [0, 1, 2]
    assert 0.0 <= records[0]["heldout/accuracy"] <= 1.0
    for r in records[1:]:
        assert {"reward/accuracy", "heldout/accuracy", "time/step"} <= r.keys()
        assert r["rollout/samples"] == 16
    # TensorBoard: an event file whose scalars include the held-out accuracy.
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    events = EventAccumulator(str(run_dir / "tensorboard"))
    events.Reload()
    assert [e.step for e in events.Scalars("heldout/accuracy")] == [0, 1, 2]
    for png in ("learning_curve.png", "timeline.png"):
        data = (run_dir / png).read_bytes()
        assert data[:8] == b"\x89PNG\r\n\x1a\n"
        width, height = struct.unpack(">II", data[16:24])
        assert width > 100 and height > 100
    trace = json.loads((run_dir / "trace.json").read_text())
    events_ = trace["traceEvents"] if isinstance(trace, dict) else trace
    pids = {e["pid"] for e in events_ if e.get("ph") == "X"}
    assert len(pids) == 2, "measured and predicted timelines side by side"
    names = {e["name"] for e in events_ if e.get("ph") == "X"}
    assert names, "the trace has spans"
    # samples.jsonl: each evaluation's first run.eval_samples (4) held-out responses.
    samples = read_jsonl(run_dir / "samples.jsonl")
    assert [s["step"] for s in samples] == [0] * 4 + [1] * 4 + [2] * 4
    for sample in samples:
        assert {"prompt", "response", "answer", "reward"} <= sample.keys()
        assert sample["prompt"].endswith("=") and sample["reward"] in (0.0, 1.0)
    assert "first prompt: '" in stdout
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["steps"] == 2 and summary["mode"] == "collocated"
    assert summary["placement"] == "rollout,reward,inference,actor: 0"
    assert summary["heldout_before"] == records[0]["heldout/accuracy"]
    assert summary["heldout_after"] == records[-1]["heldout/accuracy"]
    assert summary["predicted_iteration_s"] > 0 and summary["measured_iteration_s"] > 0
    assert "held-out accuracy   " in stdout and "samples/s" in stdout
    # The banner: what was loaded, before anything runs.
    assert "model: warm start " in stdout and "parameters, stored float32" in stdout
    assert "data: generated level " in stdout and "held-out" in stdout
    assert (run_dir / "checkpoints" / "LATEST").read_text().strip() == "step-00000002"
    # run.export_hf: the checkpoint also as a Hugging Face folder
    assert (run_dir / "hf" / "step-00000002" / "model.safetensors").is_file()
    # run.loggers: wandb offline (no login here) and MLflow's local store beside the JSONL
    assert len(list((run_dir / "wandb").glob("offline-run-*/*.wandb"))) == 1
    client, run_id = mlflow_run(run_dir)
    run = client.get_run(run_id)
    assert run.info.status == "FINISHED" and run.data.params["algorithm.name"] == "grpo"
    assert [(m.step, m.value) for m in client.get_metric_history(run_id, "heldout/accuracy")] \
        == [(r["step"], r["heldout/accuracy"]) for r in records]


@pytest.mark.parametrize("overrides", [
    ("placement=disaggregated", "cluster.cpu_slots=4"),
    ("placement='rollout: 0, actor,reward,inference: 1'",),
], ids=["disaggregated", "hybrid"])
def test_every_mode_gives_the_same_metrics(reference_run: tuple[Path, str], tmp_path: Path,
                                           overrides: tuple[str, ...], ray_address: str) -> None:
    ref_dir, _ = reference_run
    proc = run_cli(tmp_path / "run", *overrides, "run.predict=false", ray_address=ray_address)
    mode = "disaggregated" if "disaggregated" in overrides[0] else "hybrid"
    assert f"mode                {mode}: " in proc.stdout
    assert_same_metrics(read_jsonl(ref_dir / "metrics.jsonl"),
                        read_jsonl(tmp_path / "run" / "metrics.jsonl"), tol=1e-3)


def auto_dry_run_cli(run_dir: Path, cache: Path,
                     ray_address: str | None = None) -> subprocess.CompletedProcess[str]:
    """``placement=auto --dry-run`` with the profile cache `cache` (its status unchecked), on
    the Ray instance at `ray_address` when given."""
    return subprocess.run(cli_command(run_dir, "placement=auto", "--dry-run",
                                      f"run.profile_cache={cache}"),
                          capture_output=True, text=True, env=cli_env(ray_address),
                          timeout=400, check=False)


@pytest.fixture(scope="module")
def auto_first_run(tmp_path_factory: pytest.TempPathFactory,
                   ray_address: str) -> tuple[Path, str]:
    """``placement=auto`` with an empty profile cache: it starts at once, collocated (the
    first guess), and caches what it measured; the other auto tests plan from copies of
    that cache. On the shared Ray instance, which declares 8 CPUs on this 2-core machine:
    discovery counts the machine's cores, not Ray's CPUs."""
    root = tmp_path_factory.mktemp("auto")
    cache = root / "profiles"
    proc = run_cli(root / "run", "placement=auto", "run.eval_every=0",
                   "run.checkpoint_every=0", f"run.profile_cache={cache}",
                   ray_address=ray_address)
    slots = min(8, len(os.sched_getaffinity(0)))
    assert "auto: no profile of this workflow, model and cluster is cached: starting " \
        "collocated (the first guess)" in proc.stdout, proc.stdout
    summary = json.loads((root / "run" / "summary.json").read_text())
    assert summary["mode"] == "collocated"
    devices = f"0-{slots - 1}" if slots > 1 else "0"
    assert summary["placement"] == f"rollout,reward,inference,actor: {devices}"
    assert summary["predicted_iteration_s"] > 0  # priced from its own steps
    return cache, proc.stdout + proc.stderr  # (the progress lines go to stderr)


def test_auto_without_a_profile_reaches_its_first_step_without_profiling(
        auto_first_run: tuple[Path, str]) -> None:
    cache, output = auto_first_run
    assert "train 1/2" in output
    assert "profiling" not in output  # no probe runs, before the first step or after it
    assert "planner: ranked plans" not in output
    assert len(list(cache.glob("*.json"))) == 1


def _copy_cache(cache: Path, tmp_path: Path) -> Path:
    copy = tmp_path / "profiles"
    shutil.copytree(cache, copy)
    return copy


def test_auto_tries_the_closest_priced_plans_and_launches_the_fastest_measured(
    auto_first_run: tuple[Path, str], tmp_path: Path, ray_address: str
) -> None:
    """The trials, then the launched plan reported as every run is: predicted against
    measured, and the device lock's context switches against the simulation's. (Auto
    without trials, ``run.trial_plans=0``, runs in test_megatron's auto-cut mode.)"""
    cache = _copy_cache(auto_first_run[0], tmp_path)
    # A margin wide enough that the two best-priced plans are tried, whatever their prices.
    proc = run_cli(tmp_path / "run", "placement=auto", "run.eval_every=0", "run.steps=2",
                   "run.checkpoint_every=0", f"run.profile_cache={cache}",
                   "run.trial_plans=2", "run.trial_margin=100", "run.trial_steps=2",
                   ray_address=ray_address)
    # the run's length is not in the key
    assert "auto: priced from the profile measured before" in proc.stdout
    assert "planner: ranked plans" in proc.stdout and " *1. " in proc.stdout
    # the search is announced before it runs (it can take a while on many slots)
    assert proc.stdout.index("auto: planning on") < proc.stdout.index("planner: ranked plans")
    assert "auto: 2 plans priced within 10000% of the best; running each for 2 steps" \
        in proc.stdout
    summary = json.loads((tmp_path / "run" / "summary.json").read_text())
    trials = summary["trials"]
    assert len(trials) == 2
    assert all(len(t["step_seconds"]) == 1 and t["measured_s"] > 0 for t in trials)
    plans = json.loads((tmp_path / "run" / "plan.json").read_text())
    ranked = [(p["spec"], p["granularity"]) for p in (plans["best"], *plans["alternatives"])]
    # the best-priced plan first, then the next one the simulation tells apart from it
    tried = [(t["plan"], t["granularity"]) for t in trials]
    assert tried[0] == ranked[0] and tried[1] in ranked[1:]
    # the fastest as measured is the one launched, priced as every other run
    fastest = min(trials, key=lambda t: t["measured_s"])
    assert summary["placement"] == fastest["plan"]
    assert summary["predicted_iteration_s"] == pytest.approx(fastest["predicted_s"])
    assert " * " in proc.stdout and fastest["plan"] in proc.stdout
    assert summary["measured_iteration_s"] > 0
    assert "s median (predicted " in proc.stdout
    # Context switches of the steady iteration (the second): the lock's onloads equal the
    # simulation's that gave the prediction (tiny models fit beside each other: none).
    assert isinstance(summary["simulated_switches"], int)
    assert summary["lock_switches_per_iteration"] == summary["simulated_switches"]
    assert "per iteration by the device lock" in proc.stdout


def _kill_tree(proc: subprocess.Popen[str]) -> None:
    """SIGKILL the run and every process it started (Ray's too), children first."""
    parent = psutil.Process(proc.pid)
    for child in parent.children(recursive=True):
        with contextlib.suppress(psutil.NoSuchProcess):
            child.send_signal(signal.SIGKILL)
    proc.send_signal(signal.SIGKILL)
    proc.wait(timeout=30)


def _weights(run_dir: Path, step: int) -> dict[str, torch.Tensor]:
    path = run_dir / "checkpoints" / f"step-{step:08d}" / "actor" / "rank0.pt"
    state = torch.load(path, map_location="cpu", weights_only=False)
    return {k: v for k, v in state["model"].items() if isinstance(v, torch.Tensor)}


def test_resume_after_sigkill_matches_an_uninterrupted_run(
        reference_run: tuple[Path, str], reference_profiles: Path, tmp_path: Path,
        ray_address: str) -> None:
    ref_dir, _ = reference_run
    run_dir = tmp_path / "run"
    args = (*REFERENCE, f"run.profile_cache={reference_profiles}")
    proc = subprocess.Popen(cli_command(run_dir, *args), stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True, env=cli_env())
    latest = run_dir / "checkpoints" / "LATEST"
    deadline = time.monotonic() + 600
    try:
        while not (latest.exists() and latest.read_text().strip() == "step-00000001"):
            if proc.poll() is not None:
                pytest.fail(f"the run ended before its first checkpoint:\n{proc.stdout.read()}"
                            if proc.stdout else "the run ended early")
            if time.monotonic() > deadline:
                pytest.fail("no checkpoint within 600 s")
            time.sleep(0.05)
    finally:
        _kill_tree(proc)
        output = proc.stdout.read() if proc.stdout else ""
        if proc.stdout:
            proc.stdout.close()
    assert "predict: priced from the profile measured before" in output, output  # the
    # reference run's
    killed = read_jsonl(run_dir / "metrics.jsonl")
    assert killed[-1]["step"] <= 2
    # The killed run owned its Ray (killed with it); the resume joins the suite's.
    resumed = run_cli(run_dir, *args, "--resume", ray_address=ray_address)
    assert "resuming from step 1" in resumed.stdout  # priced from the run folder's profile
    assert_same_metrics(read_jsonl(ref_dir / "metrics.jsonl"),
                        read_jsonl(run_dir / "metrics.jsonl"), tol=1e-5)
    # the trackers went on with the killed run's tracker runs
    client, run_id = mlflow_run(run_dir)
    assert client.get_run(run_id).info.status == "FINISHED"
    assert len(client.search_runs([client.get_run(run_id).info.experiment_id])) == 1
    assert {m.step for m in client.get_metric_history(run_id, "heldout/accuracy")} == {0, 1, 2}
    assert len(list((run_dir / "wandb").glob(
        f"offline-run-*-{(run_dir / '.wandb-run-id').read_text().strip()}"))) == 2
    ref, got = _weights(ref_dir, 2), _weights(run_dir, 2)
    assert ref.keys() == got.keys()
    for name, tensor in ref.items():
        torch.testing.assert_close(got[name], tensor, rtol=1e-5, atol=1e-6, msg=name)


def test_resume_refuses_a_changed_config(reference_run: tuple[Path, str]) -> None:
    ref_dir, _ = reference_run
    proc = subprocess.run(cli_command(ref_dir, *REFERENCE, "run.steps=3", "algorithm.lr=0.001",
                                      "--resume"),
                          capture_output=True, text=True, env=cli_env(), timeout=120,
                          check=False)
    assert proc.returncode == 2
    assert "algorithm.lr: 0.0003 -> 0.001" in proc.stderr
    assert "Traceback" not in proc.stderr


def test_auto_dry_run_plans_from_the_cached_profile_and_trains_nothing(
    auto_first_run: tuple[Path, str], tmp_path: Path, ray_address: str
) -> None:
    cache = _copy_cache(auto_first_run[0], tmp_path)
    proc = auto_dry_run_cli(tmp_path / "run", cache, ray_address)
    assert proc.returncode == 0, proc.stdout + proc.stderr[-4000:]
    assert "\nplacement: auto\n" in proc.stdout
    assert "auto: priced from the profile measured before" in proc.stdout
    assert "planner: ranked plans (predicted seconds per iteration)" in proc.stdout
    assert " *1. " in proc.stdout and "predicted iteration time:" in proc.stdout
    assert not (tmp_path / "run").exists(), "a dry run trains nothing and writes no run folder"
    # and without a profile it says what the run would do, at once
    empty = auto_dry_run_cli(tmp_path / "run", tmp_path / "empty", ray_address)
    assert empty.returncode == 0, empty.stdout + empty.stderr[-4000:]
    assert "starting collocated (the first guess)" in empty.stdout


def test_the_profile_key_follows_the_model_and_not_the_runs_length() -> None:
    from rlinf_reasoning.cli import compose_config
    from rlinf_reasoning.config import from_omegaconf
    from rlinf_reasoning.run import profile_identity
    from rlinf_reasoning.spec import flow_spec
    from rlinf_reasoning.workflow import reasoning_workflow

    from rlinf.sched import Cluster, profile_key

    def key(*overrides: str) -> str:
        cfg = from_omegaconf(compose_config([*TINY, "placement=auto", *overrides]))
        return profile_key(workflow=reasoning_workflow(flow_spec(cfg)),
                           cluster=Cluster.uniform(1, 2, "8GiB", "cpu"),
                           model=profile_identity(cfg))

    base = key()
    # a sweep's jobs over seeds and lengths share one profile
    assert key("run.steps=7", "run.eval_every=0", "run.checkpoint_every=0", "run.seed=3") \
        == base
    assert key("rollout.max_new_tokens=5") != base  # another model: profiled again
    # what the profile records is part of its identity: an older profile is measured again
    from rlinf.workers.flow.auto import PROFILE_FORMAT

    cfg = from_omegaconf(compose_config([*TINY, "placement=auto"]))
    assert profile_identity(cfg)["profile_format"] == PROFILE_FORMAT


def test_an_unusable_profile_cache_is_refused_before_the_run(tmp_path: Path) -> None:
    blocker = tmp_path / "file"
    blocker.write_text("not a folder")
    proc = auto_dry_run_cli(tmp_path / "run", blocker / "profiles")
    assert proc.returncode == 2, proc.stdout + proc.stderr[-4000:]
    assert "run.profile_cache" in proc.stderr and "Traceback" not in proc.stderr
    assert "\nplan: " not in proc.stdout


# Two runs (55 s on CI's slower host): tox -e test-long runs it.
@pytest.mark.long
def test_a_multirun_sweep_trains_one_run_per_value_and_tabulates_them(
        tmp_path: Path, ray_address: str) -> None:
    base = tmp_path / "sweep"
    proc = subprocess.run(
        [sys.executable, "-m", "rlinf_reasoning.cli", "-m", *TINY, "placement=collocated",
         "cluster.cpu_slots=1", "run.predict=false", "run.checkpoint_every=0",
         "run.seed=0,1", "--run-dir", str(base)],
        capture_output=True, text=True, timeout=600, env=cli_env(ray_address), check=False)
    assert proc.returncode == 0, proc.stdout + proc.stderr[-4000:]
    runs = [read_jsonl(base / str(i) / "metrics.jsonl") for i in (0, 1)]
    assert all([r["step"] for r in records] == [0, 1, 2] for records in runs)
    assert stable(runs[0][1]) != stable(runs[1][1])  # another seed, another trajectory
    for i in (0, 1):
        summary = json.loads((base / str(i) / "summary.json").read_text())
        line = (f"  {i}: run.seed={i}: held-out {format_fixed(summary['heldout_before'], 3)}"
                f" -> {format_fixed(summary['heldout_after'], 3)}")
        assert line in proc.stdout, proc.stdout


def test_a_policy_lag_trains_each_step_beside_the_next_rollout(tmp_path: Path,
                                                                ray_address: str) -> None:
    """algorithm.policy_lag=1 with the actor on a device of its own: step 1 trains nothing,
    step k trains step k-1's responses (the rollout correction weighing them against the
    stale sampling policy), and the last step also trains its own before the checkpoint."""
    run_dir = tmp_path / "run"
    proc = run_cli(run_dir, "run.steps=3", "run.checkpoint_every=0", "run.predict=false",
                   "algorithm.policy_lag=1", "algorithm.rollout_correction_cap=2",
                   "algorithm.recompute_logprobs=false",
                   "placement='rollout,reward: 0, actor: 1'", ray_address=ray_address)
    assert "rollout,reward: 0, actor: 1" in proc.stdout
    records = read_jsonl(run_dir / "metrics.jsonl")
    trained = {int(r["step"]): r for r in records if "actor/policy_loss" in r}
    assert sorted(trained) == [2, 3]
    assert all(r["actor/rollout_correction_weight"] > 0 for r in trained.values())
    assert (run_dir / "checkpoints" / "LATEST").read_text().strip() == "step-00000003"


def test_the_rollout_correction_needs_no_recompute_with_one_update_per_step(
        tmp_path: Path, ray_address: str) -> None:
    """One optimizer step per batch: the actor weighs each token by pi_old / pi_rollout with
    pi_old from its own training forward, so no inference role runs. The HF engine samples
    with the trainer's weights, so every weight is 1 up to float noise."""
    run_dir = tmp_path / "run"
    run_cli(run_dir, "run.steps=2", "run.checkpoint_every=0", "run.predict=false",
            "algorithm.rollout_correction_cap=2", "algorithm.recompute_logprobs=false",
            ray_address=ray_address)
    records = [r for r in read_jsonl(run_dir / "metrics.jsonl") if "actor/policy_loss" in r]
    assert len(records) == 2
    for record in records:
        assert record["actor/rollout_correction_weight"] == pytest.approx(1.0, abs=1e-3)
        assert record["actor/clip_fraction"] == 0.0
        assert not any(key.startswith("time/inference") for key in record)
