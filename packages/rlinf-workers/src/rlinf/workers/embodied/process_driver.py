"""Pipelined rollout with the policy in its own process (`PolicyProcess`).

Threads overlap simulation and inference only where both release the GIL (inside
``mj_step`` and torch ops); the Python around them serialises (docs/architecture.md has the
measurements). A spawned process gives the policy its own interpreter. Micro-batches travel
over `multiprocessing` queues (pickled numpy; a few hundred bytes per env), the fallback the
design allows until rlinf.comm channels are wired in: `EnvWorker.rollout` takes a Channel
as sink and source just the same.
"""

from __future__ import annotations

import multiprocessing as mp
import queue
import time
from collections import deque
from collections.abc import Mapping
from typing import Any

import torch

from rlinf.comm import Batch
from rlinf.workers.embodied.rollout import PolicyRolloutConfig, PolicyRolloutWorker
from rlinf.workers.env.link import LinkTimeoutError
from rlinf.workers.env.worker import EnvRollout, EnvWorker
from rlinf.workers.errors import WorkerCallError
from rlinf.workers.runtime.context import WorkerContext

__all__ = ["PolicyProcess", "run_pipelined_process"]

_ERROR = "__error__"


class _KeyedPipe:
    """Keyed FIFO over one multiprocessing queue, for a single consumer: items of other keys
    that arrive first are held until asked for."""

    def __init__(self, channel: Any) -> None:
        self._queue = channel
        self._held: dict[str | None, deque[Batch]] = {}

    def put(self, item: Batch, *, key: str | None = None) -> None:
        self._queue.put((key, dict(item.tensors), dict(item.meta)))

    def get(self, *, key: str | None = None, timeout: float | None = None) -> Batch:
        held = self._held.get(key)
        if held:
            return held.popleft()
        deadline = None if timeout is None else time.monotonic() + timeout
        while True:
            left = None if deadline is None else max(deadline - time.monotonic(), 0.0)
            try:
                got_key, tensors, meta = self._queue.get(timeout=left)
            except queue.Empty:
                raise LinkTimeoutError(
                    f"expected an item under key {key!r} within {timeout} s; none arrived"
                ) from None
            if got_key == _ERROR:
                raise tensors  # the peer's exception, sent instead of an item
            item = Batch(tensors, meta=meta)
            if got_key == key:
                return item
            self._held.setdefault(got_key, deque()).append(item)


def _policy_main(config: PolicyRolloutConfig, commands: Any, replies: Any,
                 observations: Any, actions: Any) -> None:
    """Body of the policy process: build the worker, then run commands until "stop"."""
    worker = PolicyRolloutWorker(WorkerContext(role="rollout", rank=0, world_size=1),
                                 config=config)
    source, sink = _KeyedPipe(observations), _KeyedPipe(actions)
    while True:
        op, arg = commands.get()
        try:
            if op == "serve":
                worker.serve(source=source, sink=sink, num_steps=arg[0], num_stages=arg[1],
                             timeout=arg[2])
            elif op == "set_weights":
                worker.set_weights(arg)
            replies.put(("ok", None))
        except Exception as exc:
            if op == "serve":
                actions.put((_ERROR, exc, None))  # wake the env worker waiting for actions
            replies.put(("error", exc))
        if op == "stop":
            return


class PolicyProcess:
    """A `PolicyRolloutWorker` running in a spawned process; `close()` (or `with`) ends it."""

    def __init__(self, config: PolicyRolloutConfig, *, timeout: float = 120.0) -> None:
        ctx = mp.get_context("spawn")  # fork would copy torch's thread pools and locks
        self._commands, self._replies = ctx.Queue(), ctx.Queue()
        obs_queue, action_queue = ctx.Queue(), ctx.Queue()
        self.observations = _KeyedPipe(obs_queue)
        """Sink of the env worker (observations to the policy)."""
        self.actions = _KeyedPipe(action_queue)
        """Source of the env worker (actions from the policy)."""
        self._timeout = timeout
        self._process = ctx.Process(
            target=_policy_main, name="policy-rollout", daemon=True,
            args=(config, self._commands, self._replies, obs_queue, action_queue))
        self._process.start()

    def _call(self, op: str, arg: Any) -> None:
        self._commands.put((op, arg))
        self.wait()

    def wait(self, timeout: float | None = None) -> None:
        """Wait for the last command; re-raise the policy's exception as WorkerCallError."""
        limit = self._timeout if timeout is None else timeout
        try:
            status, detail = self._replies.get(timeout=limit)
        except queue.Empty:
            raise WorkerCallError("rollout", 0, method="policy process", detail=(
                f"no answer within {limit} s (alive: {self._process.is_alive()})")) from None
        if status == "error":
            raise WorkerCallError("rollout", 0, method="serve", detail=repr(detail),
                                  cause=detail)

    def set_weights(self, weights: Mapping[str, torch.Tensor]) -> None:
        """Load parameters into the policy process."""
        self._call("set_weights", {k: v.detach().cpu() for k, v in weights.items()})

    def start_serving(self, *, num_steps: int, num_stages: int, timeout: float | None) -> None:
        """Let the policy answer one rollout (returns at once; `wait()` for the end)."""
        self._commands.put(("serve", (num_steps, num_stages, timeout)))

    def close(self) -> None:
        """Stop the process (terminate it if it does not stop within 10 s)."""
        if self._process.is_alive():
            self._commands.put(("stop", None))
            self._process.join(timeout=10)
        if self._process.is_alive():
            self._process.terminate()
            self._process.join()

    def __enter__(self) -> PolicyProcess:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def run_pipelined_process(env: EnvWorker, policy: PolicyProcess, *, num_steps: int,
                          timeout: float | None = 60.0) -> EnvRollout:
    """One rollout with the policy serving stage groups from its own process."""
    policy.start_serving(num_steps=num_steps, num_stages=len(env.groups), timeout=timeout)
    try:
        result = env.rollout(num_steps=num_steps, sink=policy.observations,
                             source=policy.actions, timeout=timeout)
    except BaseException:
        policy.close()  # the policy may be mid-rollout; it cannot be resynchronised
        raise
    policy.wait()
    return result
