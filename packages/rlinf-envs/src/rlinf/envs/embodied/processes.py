"""`EnvProcessPool`: simulators sharded over worker processes, for slow simulators.

A renderer such as LIBERO's (software OpenGL) keeps one core busy per
env, and Python threads cannot share that work (the robosuite code around MuJoCo holds the
GIL). The pool starts `processes` fresh interpreters. With one stage group, process s owns
the envs whose global index i has ``i % processes == s`` (interleaved, so the group's step
runs on all of them at once); with several, each process serves one group
(`process_layout`), so that a group resetting (seconds for LIBERO) holds up no other group.
Each env is seen through a `RemoteEnv` proxy that `LoopVectorEnv` steps like any
`SingleEnv`; the loop sends every env's action first (`RemoteEnv.step_async`) and then
collects the results, so the processes step in parallel.

Auto-reset happens in the env's own process right after the step that ended its episode,
and the proxy hands the new first observation to the loop's following ``reset(seed=None)``:
resets run in parallel too, and a trajectory is exactly that of the same envs in one
process (same seeds, same actions, same observations; tested).

Messages are pickled over one socket pair per process (replies tagged with their env, so
stage groups stepped from different threads get their own): a round trip is
negligible beside a rendered step, a loss for fast MuJoCo steps (use the batched MuJoCo
backend's threads there). A process that dies (killed, crashed) surfaces as
`EnvProcessError` naming it, its exit code and its envs; `close` stops every process.
"""

from __future__ import annotations

import contextlib
import socket
import subprocess
import sys
import threading
from collections.abc import Callable, Sequence
from multiprocessing.connection import Connection
from typing import Any

import gymnasium as gym
import numpy as np

from rlinf.envs.errors import ConfigError, EnvProcessError

__all__ = ["EnvProcessError", "EnvProcessPool", "RemoteEnv", "ShardBuilder", "process_layout"]

ShardBuilder = Callable[[Sequence[int]], list[Any]]
"""Builds the `SingleEnv`s of the given global env indices, in a worker process (it must
pickle: e.g. a frozen dataclass with ``__call__``, as `rlinf.envs.embodied.ShardSpec`)."""

_START_TIMEOUT = 600.0
"""Seconds a process may take to import and build its simulators."""


class _Process:
    """One worker process (``python -m rlinf.envs.embodied.env_process FD``) and its pipe: a
    fresh interpreter that does not re-run the caller's main module, as multiprocessing's
    spawn would (which needs an ``if __name__ == "__main__"`` guard in every script)."""

    def __init__(self, builder: ShardBuilder, indices: list[int], number: int) -> None:
        self.indices = indices
        self.number = number
        ours, theirs = socket.socketpair()
        with theirs:
            self.process = subprocess.Popen(
                [sys.executable, "-m", "rlinf.envs.embodied.env_process",
                 str(theirs.fileno())],
                pass_fds=(theirs.fileno(),))
        self.conn = Connection(ours.detach())
        self._send_lock = threading.Lock()
        self._receive_lock = threading.Lock()
        self._replies: dict[int, tuple[str, Any]] = {}
        self.send("start", -1, (builder, indices))

    def describe(self) -> str:
        code = self.process.poll()
        state = "running" if code is None else f"exit code {code}"
        return (f"env process {self.number} (pid {self.process.pid}, {state}, envs "
                f"{self.indices})")

    def alive(self) -> bool:
        return self.process.poll() is None

    def send(self, op: str, index: int, argument: Any = None) -> None:
        try:
            with self._send_lock:
                self.conn.send((op, index, argument))
        except (BrokenPipeError, OSError) as exc:
            raise EnvProcessError(f"{self.describe()} is gone: {exc!r}") from exc

    def receive(self, index: int, timeout: float | None = None) -> Any:
        """The reply to env `index`'s request. Envs of different stage groups may be stepped
        from different threads, so replies are matched by env: whoever reads the pipe keeps
        the replies meant for other envs until their owners ask."""
        while True:
            with self._receive_lock:
                if index in self._replies:
                    status, payload = self._replies.pop(index)
                    break
                try:
                    if timeout is not None and not self.conn.poll(timeout):
                        raise EnvProcessError(
                            f"{self.describe()} did not answer within {timeout} s")
                    owner, status, payload = self.conn.recv()
                except (EOFError, OSError) as exc:
                    with contextlib.suppress(subprocess.TimeoutExpired):
                        self.process.wait(timeout=1.0)  # for its exit code in the message
                    raise EnvProcessError(f"{self.describe()} died") from exc
                if owner == index:
                    break
                self._replies[owner] = (status, payload)
        if status != "ok":
            raise EnvProcessError(f"{self.describe()} failed:\n{payload}")
        return payload


class RemoteEnv:
    """A `SingleEnv` living in an `EnvProcessPool` process (see the module docstring)."""

    def __init__(self, process: _Process, index: int, observation_space: gym.Space[Any],
                 action_space: gym.Space[Any]) -> None:
        self._process = process
        self.index = index
        """Global index of the env."""
        self.observation_space = observation_space
        self.action_space = action_space
        self._restart: Any = None  # the next episode's first obs after an auto-reset

    def step_async(self, action: Any) -> None:
        """Send the action; `step_wait` returns the result."""
        self._process.send("step", self.index, action)

    def step_wait(self) -> tuple[Any, Any, Any, Any, dict[str, Any]]:
        """The result of the action sent by `step_async`."""
        obs, reward, terminated, truncated, info, restart = self._process.receive(self.index)
        self._restart = restart
        return obs, reward, terminated, truncated, info

    def step(self, action: Any) -> tuple[Any, Any, Any, Any, dict[str, Any]]:
        self.step_async(action)
        return self.step_wait()

    def reset_async(self, *, seed: int | None = None) -> None:
        """Start a reset; `reset_wait` returns its result (after an auto-reset in the env's
        process, ``seed=None`` returns that reset's observation without a round trip)."""
        if seed is None and self._restart is not None:
            return
        self._restart = None
        self._process.send("reset", self.index, seed)

    def reset_wait(self) -> tuple[Any, dict[str, Any]]:
        """The result of `reset_async`."""
        if self._restart is not None:
            obs, self._restart = self._restart, None
            return obs, {}
        result: tuple[Any, dict[str, Any]] = self._process.receive(self.index)
        return result

    def reset(self, *, seed: int | None = None) -> tuple[Any, dict[str, Any]]:
        self.reset_async(seed=seed)
        return self.reset_wait()

    def render(self) -> Any:
        self._process.send("render", self.index)
        return self._process.receive(self.index)

    def get_wrapper_attr(self, name: str) -> Any:
        """Attribute `name` of the env in its process (e.g. LIBERO's `instruction`)."""
        self._process.send("getattr", self.index, name)
        return self._process.receive(self.index)

    def close(self) -> None:
        """Closing one env is a no-op: `EnvProcessPool.close` stops the processes."""


def process_layout(num_envs: int, processes: int, groups: int = 1) -> list[list[int]]:
    """The global env indices each process owns, for a vector env that will be split into
    `groups` contiguous stage groups (`VectorEnv.split`'s boundaries).

    One group: env i goes to process ``i % processes`` (interleaved, so the group's step runs
    on every process). Several: no process holds envs of two groups unless there are fewer
    processes than groups (then group g lives in process ``g % processes``); with more,
    process p serves group ``p % groups`` and a group's envs are interleaved over its
    processes. A stage group that waits for its step or its resets then never delays
    another group's requests queued behind them in the same process, and groups stepped
    concurrently (`rlinf.workers` runs them in threads) keep every process busy."""
    if not 1 <= processes <= num_envs or not 1 <= groups <= num_envs:
        raise ConfigError(f"processes and groups must be between 1 and num_envs={num_envs}, "
                          f"got {processes} and {groups}")
    bounds = [part.tolist() for part in np.array_split(np.arange(num_envs), groups)]
    owned: list[list[int]] = [[] for _ in range(processes)]
    for g, members in enumerate(bounds):
        mine = [p for p in range(processes) if p % groups == g] or [g % processes]
        for j, index in enumerate(members):
            owned[mine[j % len(mine)]].append(index)
    return owned


class EnvProcessPool:
    """`num_envs` envs built by `builder` in `processes` worker processes, laid out for
    `groups` stage groups (`process_layout`)."""

    def __init__(self, builder: ShardBuilder, *, num_envs: int, processes: int,
                 groups: int = 1, start_timeout: float = _START_TIMEOUT) -> None:
        layout = process_layout(num_envs, processes, groups)
        # New interpreters, not forks: the parent may hold torch threads, a GL context or
        # Ray state that a fork would copy half-working.
        self._processes: list[_Process] = []
        for number, indices in enumerate(layout):
            self._processes.append(_Process(builder, indices, number))
        self.envs: list[RemoteEnv] = [None] * num_envs  # type: ignore[list-item]
        try:
            for process in self._processes:
                spaces = process.receive(-1, timeout=start_timeout)
                for index in process.indices:
                    self.envs[index] = RemoteEnv(process, index, *spaces)
        except BaseException:
            self.close()
            raise

    @property
    def pids(self) -> list[int]:
        """Process ids of the workers."""
        return [int(p.process.pid or 0) for p in self._processes]

    def close(self, timeout: float = 10.0) -> None:
        """Close every env and stop every process (killing those that do not stop)."""
        for process in self._processes:
            if process.alive():
                with contextlib.suppress(EnvProcessError):  # it died meanwhile
                    process.send("close", -1)
        for process in self._processes:
            try:
                process.process.wait(timeout=timeout)
            except subprocess.TimeoutExpired:
                process.process.kill()
                process.process.wait(timeout=timeout)
            process.conn.close()
