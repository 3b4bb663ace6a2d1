"""The reference rollout the flow's must reproduce: env and policy alternating in this
thread, every observation batch answered at once (no Ray, no second process)."""

from __future__ import annotations

import threading
from collections import deque

from rlinf.comm import Batch
from rlinf.workers.embodied.rollout import PolicyRolloutWorker
from rlinf.workers.env.link import LinkTimeoutError
from rlinf.workers.env.worker import EnvRollout, EnvWorker


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
