"""Self-healing and interruptible runs: a 16-step ``rlinf-reasoning`` run with
``run.max_restarts=3``, three of whose worker processes are SIGKILLed at random while it
trains, finishes with exit 0, records the three restarts, and ends with the metrics and
weights of an uninterrupted run; SIGINT to the main process alone stops a run within 10 s
with the resume hint, its checkpoints intact and none of its processes left; none of these
runs leaves a shared-memory segment behind; a run whose Ray
cluster is stopped under it (``ray stop``) ends at once with `ClusterLostError`, without
trying to restart on a cluster that is gone."""

from __future__ import annotations

import contextlib
import json
import os
import random
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import psutil
import pytest
import torch

from .test_run import assert_same_metrics, cli_command, cli_env, read_jsonl, run_cli

pytestmark = pytest.mark.timeout(900)

# A suite started as a shell's background job (`cmd &`) inherits SIGINT ignored, and so
# would the runs it starts: handled here, SIGINT is back to its default in them after exec.
if signal.getsignal(signal.SIGINT) is signal.SIG_IGN:
    signal.signal(signal.SIGINT, signal.default_int_handler)

CHAOS = ("run.steps=16", "run.checkpoint_every=2", "run.eval_every=0", "placement=collocated",
         "cluster.cpu_slots=1", "run.predict=false")
"""16 steps of the tiny run, a checkpoint every other step, every role in one process."""
KILL_AFTER = (3, 7, 12)
"""Kill a worker once the run has recorded these steps (each after the previous restart)."""
ROLES = ("RolloutRole", "RewardRole", "InferenceRole", "ActorRole", "SharedProcess")
"""Process titles of the run's workers: a role's class, or the process that roles placed on
the same devices share."""


def _workers(pid: int) -> list[psutil.Process]:
    """The worker processes of the run `pid` started (its descendants running a role: Ray
    titles them ``ray::<class>``, a local rank is named ``<class>``)."""
    found = []
    for child in psutil.Process(pid).children(recursive=True):
        with contextlib.suppress(psutil.Error):
            title = " ".join(child.cmdline())
            if child.name() in ROLES or (title.startswith("ray::")
                                         and any(role in title for role in ROLES)):
                found.append(child)
    return found


def _segments() -> set[str]:
    return {name for name in os.listdir("/dev/shm") if name.startswith("rlinf-")}


def _assert_no_new_segments(before: set[str], *, within: float = 10.0) -> None:
    """No shared-memory segment of ours outlives the run: the guardians unlink what a
    killed process left once its creator is gone, so allow them `within` seconds."""
    deadline = time.monotonic() + within
    while _segments() - before and time.monotonic() < deadline:
        time.sleep(0.2)
    assert not _segments() - before, sorted(_segments() - before)


def _last_step(run_dir: Path) -> int:
    path = run_dir / "metrics.jsonl"
    if not path.exists():
        return -1
    with contextlib.suppress(json.JSONDecodeError):
        return max((int(r["step"]) for r in read_jsonl(path) if "run/restarts" not in r),
                   default=-1)
    return -1


def _chaos(proc: subprocess.Popen[str], run_dir: Path, killed: list[str],
           restarts_seen: list[int]) -> None:
    """SIGKILL a random role worker after each of `KILL_AFTER` steps, each time once the run
    has restarted from the previous kill and trained past the step."""
    pick = random.Random(0)
    for k, step in enumerate(KILL_AFTER):
        while proc.poll() is None and (len(restarts_seen) < k or _last_step(run_dir) < step):
            time.sleep(0.05)
        if proc.poll() is not None:
            return
        workers = _workers(proc.pid)
        if not workers:
            return
        victim = pick.choice(workers)
        with contextlib.suppress(psutil.Error):
            killed.append(" ".join(victim.cmdline()))
            victim.send_signal(signal.SIGKILL)


def test_a_run_heals_three_killed_workers_and_matches_an_uninterrupted_run(
        tmp_path: Path, ray_address: str) -> None:
    before = _segments()
    reference = tmp_path / "reference"
    run_cli(reference, *CHAOS, ray_address=ray_address)  # the chaos run starts its own Ray
    _assert_no_new_segments(before)
    run_dir = tmp_path / "chaos"
    proc = subprocess.Popen(cli_command(run_dir, *CHAOS, "run.max_restarts=3"),
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            env=cli_env())
    lines: list[str] = []
    restarts_seen: list[int] = []

    def read() -> None:
        assert proc.stdout is not None
        for line in proc.stdout:
            lines.append(line)
            if line.startswith("worker died"):
                restarts_seen.append(len(restarts_seen) + 1)

    reader = threading.Thread(target=read, daemon=True)
    reader.start()
    killed: list[str] = []
    _chaos(proc, run_dir, killed, restarts_seen)
    try:
        code = proc.wait(timeout=800)
    finally:
        if proc.poll() is None:
            proc.kill()
        reader.join(timeout=10)
    output = "".join(lines)
    assert code == 0, output[-4000:]
    assert len(killed) == 3 and len(restarts_seen) == 3, (killed, output[-4000:])
    summary = json.loads((run_dir / "summary.json").read_text())
    assert len(summary["restarts"]) == 3 and summary["steps"] == 16
    records = read_jsonl(run_dir / "metrics.jsonl")
    assert [r["run/restarts"] for r in records if "run/restarts" in r] == [1.0, 2.0, 3.0]
    assert_same_metrics(read_jsonl(reference / "metrics.jsonl"),
                        [r for r in records if "run/restarts" not in r], tol=1e-5)
    _assert_no_new_segments(before)
    ckpt = Path("checkpoints") / "step-00000016" / "actor" / "rank0.pt"
    ref = torch.load(reference / ckpt, map_location="cpu", weights_only=False)["model"]
    got = torch.load(run_dir / ckpt, map_location="cpu", weights_only=False)["model"]
    for name, tensor in ref.items():
        if isinstance(tensor, torch.Tensor):
            torch.testing.assert_close(got[name], tensor, rtol=1e-5, atol=1e-6, msg=name)


def test_sigint_to_the_main_process_stops_the_run_within_10_s(tmp_path: Path) -> None:
    before = _segments()
    run_dir = tmp_path / "run"
    proc = subprocess.Popen(cli_command(run_dir, *CHAOS[1:], "run.steps=500"),
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            env=cli_env())
    try:
        while _last_step(run_dir) < 3:  # past the first checkpoint (step 2)
            assert proc.poll() is None, proc.communicate()[0][-4000:]
            time.sleep(0.05)
        started_by_run = psutil.Process(proc.pid).children(recursive=True)
        sent = time.monotonic()
        proc.send_signal(signal.SIGINT)  # the main process only, not its process group
        out, _ = proc.communicate(timeout=60)
        stopped = time.monotonic() - sent
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 130 and stopped < 10.0, (proc.returncode, stopped, out[-4000:])
    assert re.search(r"interrupted; continue from the checkpoint of step \d+ with --resume",
                     out), out[-2000:]
    assert (run_dir / "checkpoints" / "LATEST").exists()
    _, alive = psutil.wait_procs(started_by_run, timeout=10)
    assert not alive, [" ".join(p.cmdline()) for p in alive if p.is_running()]
    _assert_no_new_segments(before)


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


@contextlib.contextmanager
def _ray_head() -> Iterator[tuple[str, Path]]:
    """A Ray head started with ``ray start`` in a folder of its own: (its address, the
    folder). Whatever of it is still running at the end is killed."""
    # Ray's unix sockets live under the folder: keep its path short.
    folder = Path(tempfile.mkdtemp(prefix="rlinf-rs-", dir="/tmp"))
    port = _free_port()
    ray_cli = str(Path(sys.executable).parent / "ray")
    subprocess.run([ray_cli, "start", "--head", f"--port={port}", "--num-cpus=8",
                    f"--temp-dir={folder}", "--include-dashboard=false",
                    "--disable-usage-stats"], env=cli_env(), check=True,
                   capture_output=True, timeout=120)
    try:
        yield f"127.0.0.1:{port}", folder
    finally:
        _stop_cluster(folder)
        shutil.rmtree(folder, ignore_errors=True)


def _stop_cluster(folder: Path, *, daemons_after: float = 0.0) -> None:
    """What ``ray stop`` does, for the one cluster whose session lives in `folder` (a real
    ``ray stop`` would also stop every other Ray instance on the machine): SIGTERM to its
    daemons and their workers, SIGKILL to what is left after 5 s. `daemons_after`: the
    workers go that long before the daemons (GCS, raylet), so the run sees a worker die
    while the cluster still answers: the order that lets a run mistake it for a death to
    heal."""
    daemons: list[psutil.Process] = []
    for proc in psutil.process_iter():
        with contextlib.suppress(psutil.Error):
            if str(folder) in " ".join(proc.cmdline()):
                daemons.append(proc)
    workers: list[psutil.Process] = []
    for proc in daemons:
        with contextlib.suppress(psutil.Error):
            workers += [c for c in proc.children(recursive=True) if c not in daemons]
    members = [*workers, *daemons]
    for proc in workers:
        with contextlib.suppress(psutil.Error):
            proc.terminate()
    time.sleep(daemons_after)
    for proc in daemons:
        with contextlib.suppress(psutil.Error):
            proc.terminate()
    _, alive = psutil.wait_procs(members, timeout=5)
    for proc in alive:
        with contextlib.suppress(psutil.Error):
            proc.kill()


def test_ray_stop_under_a_run_ends_it_at_once_without_restarts(tmp_path: Path) -> None:
    before = _segments()
    run_dir = tmp_path / "run"
    with _ray_head() as (address, folder):
        proc = subprocess.Popen(cli_command(run_dir, *CHAOS[1:], "run.steps=500",
                                            "run.max_restarts=3"),
                                stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                                env={**cli_env(), "RAY_ADDRESS": address})
        try:
            while _last_step(run_dir) < 3:  # past the first checkpoint (step 2)
                assert proc.poll() is None, proc.communicate()[0][-4000:]
                time.sleep(0.05)
            stopped = time.monotonic()
            _stop_cluster(folder, daemons_after=1.0)
            out, _ = proc.communicate(timeout=90)
            ended = time.monotonic() - stopped
        finally:
            if proc.poll() is None:
                proc.kill()
    assert proc.returncode == 1, out[-4000:]
    assert "ClusterLostError" in out and "--resume" in out, out[-4000:]
    assert "restart 1 of" not in out and "Traceback" not in out, out[-4000:]
    assert ended < 30.0, (ended, out[-4000:])
    assert (run_dir / "checkpoints" / "LATEST").exists()
    _assert_no_new_segments(before)
