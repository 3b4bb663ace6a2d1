"""In-process execution drivers: one env worker and one policy worker, two schedules.

- `run_collocated`: no overlap. Every observation batch is answered the moment it is sent
  (`InlinePolicyLink`), so simulation and inference strictly alternate in one thread.
- `run_pipelined`: the policy serves from a second thread through two `KeyedQueue`s, so
  while the env worker steps stage group g the policy computes the actions of group g+1.
  Overlap needs a free core and both sides outside the GIL: torch releases it inside its
  ops, but the Python around them and gymnasium's step hold it, so the overlap is partial
  at best; docs/architecture.md gives the measured rates (no gain on our loaded 2-core
  machine, where even two threads of torch matmuls ran no faster than one).

Both return the env worker's `EnvRollout`. With the same seeds and stage groups they produce
bit-identical trajectories: the policy sees the same micro-batches and each env draws from
its own sampling stream, so only the schedule differs, never what is learned.
"""

from __future__ import annotations

import threading
from collections import deque

from rlinf.comm import Batch
from rlinf.workers.embodied.rollout import PolicyRolloutWorker
from rlinf.workers.env.link import KeyedQueue, LinkClosedError, LinkTimeoutError
from rlinf.workers.env.worker import EnvRollout, EnvWorker

__all__ = ["InlinePolicyLink", "run_collocated", "run_pipelined"]


class InlinePolicyLink:
    """Sink and source in one: `put` runs the policy at once, `get` returns its answer.
    Stage groups stepped concurrently (`EnvWorker.concurrent_groups`) infer one at a time."""

    def __init__(self, policy: PolicyRolloutWorker) -> None:
        self._policy = policy
        self._replies: dict[str | None, deque[Batch]] = {}
        self._lock = threading.Lock()

    def put(self, item: Batch, *, key: str | None = None) -> None:
        with self._lock:
            self._replies.setdefault(key, deque()).append(self._policy.infer(item))

    def get(self, *, key: str | None = None, timeout: float | None = None) -> Batch:
        pending = self._replies.get(key)
        if not pending:
            # Single-threaded: nothing else can produce it, so waiting would never end.
            raise LinkTimeoutError(f"no reply pending under key {key!r}; a get without a put")
        return pending.popleft()


def run_collocated(env: EnvWorker, policy: PolicyRolloutWorker, *, num_steps: int) -> EnvRollout:
    """One rollout with simulation and inference alternating in this thread."""
    link = InlinePolicyLink(policy)
    return env.rollout(num_steps=num_steps, sink=link, source=link)


def run_pipelined(env: EnvWorker, policy: PolicyRolloutWorker, *, num_steps: int,
                  timeout: float | None = 60.0) -> EnvRollout:
    """One rollout with the policy serving stage groups from a second thread.

    An exception on either side closes both queues, so the other side fails fast instead
    of waiting out its timeout; the policy thread's exception is re-raised here.
    """
    observations, actions = KeyedQueue(), KeyedQueue()
    failure: list[BaseException] = []

    def serve() -> None:
        try:
            policy.serve(source=observations, sink=actions, num_steps=num_steps,
                         num_stages=len(env.groups), timeout=timeout)
        except BaseException as exc:
            failure.append(exc)
            actions.close()
            observations.close()

    thread = threading.Thread(target=serve, name="policy-rollout", daemon=True)
    thread.start()
    try:
        result = env.rollout(num_steps=num_steps, sink=observations, source=actions,
                             timeout=timeout)
    except BaseException as exc:
        observations.close()
        thread.join()
        if failure and isinstance(exc, LinkClosedError):
            raise failure[0] from None  # the policy failed first and closed the link
        raise
    thread.join()
    if failure:
        raise failure[0]
    return result
