"""Env and policy timings on several processes at once: the planner's data-parallel term.

`measure_components` times each component in one process, so a cost curve fitted to it
alone assumes that `k` env workers (or policy ranks) step a batch `k` times faster. They do
not: they share the machine's cores, memory bandwidth and caches with each other and with
the driver, so on a small box a plan with several env workers runs slower than priced.
`measure_parallel` starts `workers` fresh processes that each build the share
``size / workers`` of every profiled batch size, wait until all are ready, then time the
same calls at the same moment; the slowest process's median is the point
``(size, workers)``. With those points `rlinf.sched.fit_profile` separates the part of a call
that scales with devices from the part that does not.

A child is ``python -m rlinf.workers.embodied.parallel_profiling``: it reads its job
(pickled) on stdin, prints ``ready``, waits for ``go`` and prints its timings as JSON.
"""

from __future__ import annotations

import contextlib
import json
import os
import pickle
import subprocess
import sys
import tempfile
from collections.abc import Sequence
from dataclasses import dataclass, replace
from functools import partial
from typing import IO

from rlinf.sched import Measurement
from rlinf.workers.embodied.profiling import (
    MIN_REPEATS,
    PROFILE_CONTEXT,
    EnvProbe,
    env_step_seconds,
    median_seconds,
    point,
)
from rlinf.workers.embodied.roles.policy_role import build_rollout_policy
from rlinf.workers.embodied.rollout import PolicyRolloutConfig
from rlinf.workers.embodied.vla_policy import VLARolloutConfig
from rlinf.workers.env.config import EnvWorkerConfig
from rlinf.workers.errors import ConfigError, WorkersError
from rlinf.workers.runtime.threads import set_cpu_threads

__all__ = ["ParallelProfileError", "measure_parallel", "parallel_batch_sizes"]

_READY, _GO = b"ready\n", b"go\n"


class ParallelProfileError(WorkersError, RuntimeError):
    """A profiling process failed or did not answer in time."""


@dataclass(frozen=True)
class _Job:
    env: EnvWorkerConfig
    rollout: PolicyRolloutConfig | VLARolloutConfig
    shares: tuple[int, ...]
    """Envs per process, one entry per profiled batch size."""
    repeats: int


def parallel_batch_sizes(batch_sizes: Sequence[int], workers: int) -> tuple[int, ...]:
    """The batch sizes of `batch_sizes` that `workers` processes can split evenly (as the
    runtime splits a stage group over env ranks: `EnvWorkerConfig.shard`)."""
    return tuple(s for s in sorted(set(batch_sizes)) if s >= workers and s % workers == 0)


def measure_parallel(*, env: EnvWorkerConfig, rollout: PolicyRolloutConfig | VLARolloutConfig,
                     batch_sizes: Sequence[int], workers: int = 2, repeats: int = 5,
                     timeout: float = 600.0) -> list[Measurement]:
    """``env`` and ``rollout`` points on `workers` devices for every size of `batch_sizes`
    they split evenly (module docstring); none when no size does."""
    if workers < 2 or repeats < 1:
        raise ConfigError(f"need workers >= 2 and repeats >= 1, got {workers} and {repeats}")
    sizes = parallel_batch_sizes(batch_sizes, workers)
    if not sizes:
        return []
    job = pickle.dumps(_Job(env, rollout, tuple(s // workers for s in sizes),
                            max(MIN_REPEATS, repeats)))
    children: list[tuple[subprocess.Popen[bytes], IO[bytes]]] = []
    with contextlib.ExitStack() as stack:
        try:
            for rank in range(workers):
                log: IO[bytes] = stack.enter_context(tempfile.TemporaryFile())
                child = subprocess.Popen(
                    [sys.executable, "-m", __name__, str(rank)], stdin=subprocess.PIPE,
                    stdout=subprocess.PIPE, stderr=log)
                children.append((child, log))
                _write(child, len(job).to_bytes(8, "little") + job)
            for child, errors in children:
                _expect(child, errors, _READY)
            for child, _ in children:  # all built: they start their timings together
                _write(child, _GO)
            results = []
            for child, errors in children:
                out, _ = child.communicate(timeout=timeout)
                if child.returncode != 0:
                    raise ParallelProfileError(_failure(child, errors))
                results.append(json.loads(out))
        except subprocess.TimeoutExpired as exc:
            raise ParallelProfileError(f"a profiling process did not finish within {timeout} "
                                       f"s (batch sizes {list(sizes)})") from exc
        finally:
            for child, _ in children:
                if child.poll() is None:
                    child.kill()
                    child.wait()
    return [point(component, size, workers, max(r[component][i] for r in results))
            for i, size in enumerate(sizes) for component in ("env", "rollout")]


def _write(child: subprocess.Popen[bytes], data: bytes) -> None:
    if child.stdin is None:
        raise ParallelProfileError("a profiling process has no stdin")
    child.stdin.write(data)
    child.stdin.flush()


def _expect(child: subprocess.Popen[bytes], errors: IO[bytes], line: bytes) -> None:
    got = child.stdout.readline() if child.stdout is not None else b""
    if got != line:
        child.wait()
        raise ParallelProfileError(_failure(child, errors))


def _failure(child: subprocess.Popen[bytes], errors: IO[bytes]) -> str:
    errors.seek(0)
    tail = errors.read().decode(errors="replace")[-2000:]
    return f"a profiling process (pid {child.pid}) exited with {child.poll()}:\n{tail}"


def _child(rank: int) -> None:
    """One profiling process: build, report ready, wait for go, time, print JSON."""
    stdin = sys.stdin.buffer
    # Our replies keep the original stdout; logs and prints go to stderr (the parent's
    # error file) so that nothing else lands between them.
    replies = os.fdopen(os.dup(sys.stdout.fileno()), "wb")
    os.dup2(sys.stderr.fileno(), sys.stdout.fileno())
    job: _Job = pickle.loads(stdin.read(int.from_bytes(stdin.read(8), "little")))
    set_cpu_threads(1)
    policy = build_rollout_policy(PROFILE_CONTEXT, replace(job.rollout, num_threads=1))
    seed = job.env.seed + 7919 * rank  # another stream of starts than rank 0's
    probes = [EnvProbe.build(job.env, share, seed=seed) for share in job.shares]
    timings: dict[str, list[float]] = {"env": [], "rollout": []}
    try:
        replies.write(_READY)
        replies.flush()
        if stdin.readline() != _GO:
            return
        for probe in probes:
            timings["env"].append(env_step_seconds(probe.worker, probe.actions,
                                                   repeats=job.repeats))
            timings["rollout"].append(median_seconds(partial(policy.infer, probe.batch),
                                                     job.repeats))
    finally:
        for probe in probes:
            probe.worker.shutdown()
    replies.write(json.dumps(timings).encode())
    replies.close()


if __name__ == "__main__":
    _child(int(sys.argv[1]))
