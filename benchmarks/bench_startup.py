"""What a short run costs from a cold start: rlinf's apps vs TRL and Stable-Baselines3.

Launch: ``tox -e bench-startup`` (or ``RAY_AUTH_MODE=disabled RAY_USAGE_STATS_ENABLED=0
.venv/bin/python benchmarks/bench_startup.py [--rounds 3] [--steps 2] [--prompts 64]
[--group-size 8] [--num-envs 16]``). Takes a few minutes on 2 cores.

Contenders, each a cold process (its own Python, workers, models) run to its end, interleaved
round by round (A B C D E, A B C D E, ...), on the same workload:

- ``rlinf reasoning``: ``rlinf-reasoning`` as a user first runs it (its default placement,
  an empty profile cache), for ``--steps`` steps of ``--prompts`` x ``--group-size``;
- ``rlinf collocated``: the same with ``placement=collocated``;
- ``trl``: TRL's ``GRPOTrainer`` on the same model, prompts and settings in one process
  (`startup_peers`);
- ``rlinf embodied``: ``rlinf-embodied`` (PPO on InvertedDoublePendulum-v5, its default
  placement) for ``--steps`` iterations of ``--num-envs`` envs;
- ``sb3``: Stable-Baselines3 PPO on the same env and settings in one process.

For each run: the time to the first finished training step (from the process's start to the
line the program prints after it: rlinf's progress line, the peers' step line), the wall
time of the whole run, the CPU-seconds of every process it started (its process tree, its
workers included, and Ray's processes where it starts Ray; polled every 50 ms: a process's
last 50 ms can be missed),
the CPU-seconds spent by the time of that first step, and how many processes it started.
Medians over rounds; the load average at the start and the end.

Each round also starts a longer default reasoning run and presses Ctrl-C (SIGINT to its main
process) once it reports a step past the third: the seconds until it has exited, every
process gone.

The last line is one JSON object: ``ttfs_ratio_vs_trl`` (rlinf reasoning's time to the first
step over TRL's), ``short_run_ratio_vs_trl`` (the same for the whole run), ``launch_cpu_s``
(rlinf reasoning's CPU-seconds by its first finished step, the step included),
``embodied_ttfs_ratio_vs_sb3``, ``exit_after_summary_s`` (rlinf reasoning, from its summary
to its exit) and ``ctrl_c_stop_s``, with each contender's medians.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

import psutil

HERE = Path(__file__).resolve().parent


@dataclass(frozen=True)
class Contender:
    """A program to start cold, and the output line that says its first step is done."""

    label: str
    command: list[str]
    first_step: re.Pattern[str]


@dataclass
class Sample:
    """One cold run of a contender."""

    ttfs: float
    wall: float
    cpu: float
    cpu_at_first_step: float
    processes: int
    exit_after_last_line: float
    """Seconds from the program's last output line (rlinf's summary) to its exit."""
    cpu_by_process: dict[str, float] = field(default_factory=dict)
    """CPU-seconds by the first step, per kind of process (`_kind`)."""


@dataclass
class _Tree:
    """CPU-seconds of a process tree, polled: each pid's largest user+system seen."""

    root: psutil.Process
    cpu: dict[int, float] = field(default_factory=dict)
    known: dict[int, psutil.Process] = field(default_factory=dict)

    def poll(self) -> None:
        try:
            found = [self.root, *self.root.children(recursive=True)]
        except psutil.Error:
            found = []
        for proc in found:
            self.known.setdefault(proc.pid, proc)
        for pid, proc in list(self.known.items()):  # orphans (Ray's) are still ours
            try:
                times = proc.cpu_times()
            except psutil.Error:
                continue
            self.cpu[pid] = max(self.cpu.get(pid, 0.0), times.user + times.system)

    @property
    def total(self) -> float:
        return sum(self.cpu.values())

    def by_kind(self) -> dict[str, float]:
        """CPU-seconds so far per kind of process (`_kind`), largest first."""
        kinds: dict[str, float] = {}
        for pid, seconds in self.cpu.items():
            kind = _kind(self.known[pid], root=pid == self.root.pid)
            kinds[kind] = kinds.get(kind, 0.0) + seconds
        return dict(sorted(kinds.items(), key=lambda item: -item[1]))

    def alive(self) -> list[psutil.Process]:
        return [p for p in self.known.values() if p.is_running()
                and p.status() != psutil.STATUS_ZOMBIE]


def _kind(proc: psutil.Process, *, root: bool) -> str:
    """A process's kind for the breakdown: the driver, a worker by its class (a Ray actor's
    ``ray::`` title, a local rank's process name), or the program a service runs."""
    if root:
        return "driver"
    try:
        name, cmdline = proc.name(), proc.cmdline()
    except psutil.Error:
        return "gone"
    if name.startswith("ray::"):
        return name
    program = next((Path(part).name for part in cmdline if "/" in part and not
                    part.endswith(("python", "python3")) and "python3." not in Path(part).name),
                   name)
    return program.removesuffix(".py")


def run_cold(contender: Contender, *, env: dict[str, str], timeout: float) -> Sample:
    """Start `contender` as a new process, time it to its first step and its end."""
    started = time.perf_counter()
    proc = subprocess.Popen(contender.command, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True, env=env)
    tree = _Tree(psutil.Process(proc.pid))
    first: list[float] = []
    cpu_first: list[float] = []
    lines: list[str] = []
    last_line = [started]
    kinds: dict[str, float] = {}

    def read() -> None:
        assert proc.stdout is not None
        for line in proc.stdout:
            lines.append(line)
            last_line[0] = time.perf_counter()
            if not first and contender.first_step.search(line):
                first.append(time.perf_counter() - started)
                tree.poll()
                cpu_first.append(tree.total)
                kinds.update(tree.by_kind())

    reader = threading.Thread(target=read, daemon=True)
    reader.start()
    while proc.poll() is None:
        tree.poll()
        if time.perf_counter() - started > timeout:
            proc.kill()
            raise RuntimeError(f"{contender.label} ran past {timeout:.0f} s:\n"
                               + "".join(lines[-30:]))
        time.sleep(0.01)
    ended = time.perf_counter()
    wall = ended - started
    reader.join(timeout=10)
    deadline = time.monotonic() + 30
    while (left := tree.alive()) and time.monotonic() < deadline:  # Ray's processes ending
        tree.poll()
        time.sleep(0.05)
    tree.poll()
    if proc.returncode != 0 or not first:
        raise RuntimeError(f"{contender.label} exited {proc.returncode} "
                           f"({'no' if not first else 'a'} first-step line):\n"
                           + "".join(lines[-40:]))
    if left:
        raise RuntimeError(f"{contender.label} left {len(left)} process(es) running: "
                           f"{[p.pid for p in left]}")
    return Sample(ttfs=first[0], wall=wall, cpu=tree.total, cpu_at_first_step=cpu_first[0],
                  processes=len(tree.known), exit_after_last_line=ended - last_line[0],
                  cpu_by_process=kinds)


def interrupt_cold(command: list[str], *, env: dict[str, str], after: re.Pattern[str],
                   timeout: float) -> float:
    """Start `command`, send SIGINT to its main process once a line matches `after` (the
    progress line of a step past the third: off a terminal it prints every few seconds),
    and return the seconds until it exited (it must exit 130, as rlinf's CLIs do)."""
    proc = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            text=True, env=env)
    tree = _Tree(psutil.Process(proc.pid))
    assert proc.stdout is not None
    sent = None
    lines = []
    deadline = time.perf_counter() + timeout
    for line in proc.stdout:
        lines.append(line)
        tree.poll()
        match = after.search(line)
        if sent is None and match and int(match.group(1)) >= 3:
            sent = time.perf_counter()
            proc.send_signal(signal.SIGINT)  # the main process alone, as a terminal's ^C
        if time.perf_counter() > deadline:
            proc.kill()
            break
    proc.wait(timeout=60)
    stopped = time.perf_counter() - (sent or 0.0)
    deadline = time.monotonic() + 30
    while tree.alive() and time.monotonic() < deadline:
        time.sleep(0.05)
    if sent is None or proc.returncode != 130 or tree.alive():
        raise RuntimeError(f"the interrupted run exited {proc.returncode} (signal "
                           f"{'sent' if sent else 'never sent'}, {len(tree.alive())} "
                           "process(es) left):\n" + "".join(lines[-30:]))
    return stopped


def contenders(args: argparse.Namespace, scratch: Path) -> list[Contender]:
    py = sys.executable
    steps = str(args.steps)
    reasoning = [py, "-m", "rlinf_reasoning.cli", f"run.steps={steps}",
                 f"data.prompts_per_step={args.prompts}", f"rollout.group_size={args.group_size}",
                 f"rollout.max_new_tokens={args.new_tokens}", "run.checkpoint_every=0",
                 "run.eval_every=0", "run.loggers=[jsonl]"]
    embodied = [py, "-m", "rlinf_embodied.cli", f"run.iterations={steps}",
                f"env.num_envs={args.num_envs}", "run.video=false", "run.eval_every=0",
                "run.checkpoint_every=0"]
    peers = [py, str(HERE / "startup_peers.py")]
    settings = ["--steps", steps, "--prompts", str(args.prompts), "--group-size",
                str(args.group_size), "--new-tokens", str(args.new_tokens),
                "--num-envs", str(args.num_envs)]
    out = [
        Contender("rlinf reasoning", [*reasoning, "--run-dir", str(scratch / "r{n}")],
                  re.compile(r"^train 1/")),
        Contender("rlinf collocated", [*reasoning, "placement=collocated", "--run-dir",
                                       str(scratch / "c{n}")], re.compile(r"^train 1/")),
        Contender("trl", [*peers, "trl", *settings], re.compile(r"^trl step 1 ")),
    ]
    if not args.skip_embodied:
        out += [
            Contender("rlinf embodied", [*embodied, "--run-dir", str(scratch / "e{n}")],
                      re.compile(r" 1/\d+ \(")),
            Contender("sb3", [*peers, "sb3", *settings], re.compile(r"^sb3 step 1 ")),
        ]
    return out


def _env(cache: Path) -> dict[str, str]:
    """A cold run's environment: its own (empty) profile cache, no Ray cluster to join."""
    env = {**os.environ, "RAY_AUTH_MODE": "disabled", "RAY_USAGE_STATS_ENABLED": "0",
           "TOKENIZERS_PARALLELISM": "false", "RLINF_PROFILE_CACHE": str(cache)}
    env.pop("RAY_ADDRESS", None)  # each rlinf run starts its own workers, as a user's does
    return env


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--steps", type=int, default=2, help="training steps of each run")
    parser.add_argument("--prompts", type=int, default=64, help="reasoning: prompts per step")
    parser.add_argument("--group-size", type=int, default=8, help="reasoning: responses each")
    parser.add_argument("--new-tokens", type=int, default=6, help="reasoning: response tokens")
    parser.add_argument("--num-envs", type=int, default=16, help="embodied: envs")
    parser.add_argument("--skip-embodied", action="store_true")
    parser.add_argument("--breakdown", action="store_true",
                        help="print each run's CPU-seconds by its first step per process kind")
    parser.add_argument("--timeout", type=float, default=600.0, help="seconds per run")
    args = parser.parse_args(argv)
    for flag in ("rounds", "steps", "prompts", "group_size", "new_tokens", "num_envs"):
        if getattr(args, flag) < 1:
            parser.error(f"--{flag.replace('_', '-')} must be >= 1, got {getattr(args, flag)}")
    if args.steps < 2:
        parser.error("--steps must be >= 2: the runs are timed to their first step and to "
                     "their end")
    shm_before = sum(1 for n in os.listdir("/dev/shm") if n.startswith("rlinf-"))
    load_start = os.getloadavg()
    samples: dict[str, list[Sample]] = {}
    interrupts: list[float] = []
    with tempfile.TemporaryDirectory(prefix="rlinf-bench-startup-") as root:
        scratch = Path(root)
        for n in range(args.rounds):
            for contender in contenders(args, scratch):
                command = [part.replace("{n}", str(n)) for part in contender.command]
                sample = run_cold(Contender(contender.label, command, contender.first_step),
                                  env=_env(scratch / f"profiles-{n}-{len(samples)}"),
                                  timeout=args.timeout)
                samples.setdefault(contender.label, []).append(sample)
                print(f"round {n + 1} {contender.label:17s} first step {sample.ttfs:6.2f} s  "
                      f"run {sample.wall:6.2f} s  cpu {sample.cpu:6.1f} s "
                      f"(by first step {sample.cpu_at_first_step:5.1f})  "
                      f"processes {sample.processes:3d}  exit after last line "
                      f"{sample.exit_after_last_line:4.2f} s  load {os.getloadavg()[0]:.2f}",
                      flush=True)
                if args.breakdown:
                    print("    cpu by first step: " + ", ".join(
                        f"{kind} {seconds:.1f}" for kind, seconds
                        in sample.cpu_by_process.items() if seconds >= 0.05), flush=True)
            # Ctrl-C in the middle of a longer default run, after its first checkpoint.
            reasoning = contenders(args, scratch)[0].command
            command = [("run.steps=500" if part.startswith("run.steps=") else
                        "run.checkpoint_every=1" if part.startswith("run.checkpoint_every=")
                        else part.replace("{n}", f"interrupt{n}")) for part in reasoning]
            interrupts.append(interrupt_cold(command, env=_env(scratch / f"profiles-i{n}"),
                                             after=re.compile(r"^train (\d+)/"),
                                             timeout=args.timeout))
            print(f"round {n + 1} Ctrl-C past step 3 of rlinf reasoning: exited in "
                  f"{interrupts[-1]:.2f} s", flush=True)
    load_end = os.getloadavg()
    stop = statistics.median(interrupts)
    shm_after = sum(1 for n in os.listdir("/dev/shm") if n.startswith("rlinf-"))

    def median(label: str, what: str) -> float:
        return statistics.median(getattr(s, what) for s in samples[label])

    print(f"\n{'contender':17s} {'first step s':>12s} {'run s':>7s} {'cpu s':>7s} "
          f"{'cpu by 1st':>10s} {'processes':>9s}   (medians of {args.rounds} rounds)")
    table = {}
    for label in samples:
        row = {what: median(label, what)
               for what in ("ttfs", "wall", "cpu", "cpu_at_first_step", "processes",
                            "exit_after_last_line")}
        table[label] = row
        print(f"{label:17s} {row['ttfs']:12.2f} {row['wall']:7.2f} {row['cpu']:7.1f} "
              f"{row['cpu_at_first_step']:10.1f} {row['processes']:9.0f}   exit after its "
              f"last line {row['exit_after_last_line']:.2f} s")
    print(f"rlinf reasoning stopped by Ctrl-C past step 3 in {stop:.2f} s (median)")
    print(f"load average {load_start[0]:.2f} -> {load_end[0]:.2f}; /dev/shm rlinf segments "
          f"{shm_before} -> {shm_after}; {os.cpu_count()} CPUs; setting steps={args.steps} "
          f"prompts={args.prompts} group={args.group_size} tokens={args.new_tokens} "
          f"envs={args.num_envs}")
    result: dict[str, object] = {
        "ttfs_ratio_vs_trl": round(table["rlinf reasoning"]["ttfs"] / table["trl"]["ttfs"], 3),
        "short_run_ratio_vs_trl": round(table["rlinf reasoning"]["wall"]
                                        / table["trl"]["wall"], 3),
        "launch_cpu_s": round(table["rlinf reasoning"]["cpu_at_first_step"], 2),
        "exit_after_summary_s": round(table["rlinf reasoning"]["exit_after_last_line"], 2),
        "ctrl_c_stop_s": round(stop, 2),
    }
    if not args.skip_embodied:
        result["embodied_ttfs_ratio_vs_sb3"] = round(
            table["rlinf embodied"]["ttfs"] / table["sb3"]["ttfs"], 3)
    result["medians"] = {label: {k: round(v, 3) for k, v in row.items()}
                         for label, row in table.items()}
    result["load_average"] = [round(load_start[0], 2), round(load_end[0], 2)]
    print(json.dumps(result))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
