"""`RayStore`: the `Store` interface backed by a named Ray actor.

For jobs that already run on Ray: every process that joined the Ray cluster reaches the same
named actor, so no address or token has to be passed around. Ray is an optional extra and is
imported only when a `RayStore` is created.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from rlinf.comm import errors
from rlinf.comm._internal.logs import get_logger
from rlinf.comm._internal.rpc import reply_window
from rlinf.comm._internal.store import DEFAULT_STORE_TIMEOUT_S, Store, check_timeout, check_value

log = get_logger(__name__)


def _import_ray() -> Any:
    try:
        import ray
    except ImportError as exc:
        raise errors.MissingExtraError("RayStore", "ray", "ray") from exc
    return ray


class _StoreActor:
    """The key-value map, inside a Ray actor (async, so waits do not block other calls)."""

    def __init__(self) -> None:
        import asyncio

        self._data: dict[str, bytes] = {}
        self._changed = asyncio.Condition()

    async def set(self, key: str, value: bytes) -> None:
        async with self._changed:
            self._data[key] = value
            self._changed.notify_all()

    async def wait(self, keys: list[str], timeout: float) -> bool:
        import asyncio

        async def ready() -> None:
            async with self._changed:
                await self._changed.wait_for(lambda: all(k in self._data for k in keys))

        try:
            await asyncio.wait_for(ready(), timeout)
        except TimeoutError:
            return False
        return True

    async def get(self, key: str, timeout: float) -> bytes | None:
        if not await self.wait([key], timeout):
            return None
        return self._data[key]

    async def add(self, key: str, amount: int) -> int:
        async with self._changed:
            value = int(self._data.get(key, b"0")) + amount
            self._data[key] = str(value).encode()
            self._changed.notify_all()
            return value

    async def compare_set(self, key: str, expected: bytes | None, desired: bytes) -> bytes:
        async with self._changed:
            if self._data.get(key) == expected:
                self._data[key] = desired
                self._changed.notify_all()
            return self._data.get(key, b"")

    async def delete(self, key: str) -> bool:
        async with self._changed:
            return self._data.pop(key, None) is not None


class RayStore(Store):
    """A `Store` held by the named Ray actor `name` in `namespace` (created on first use).

    Needs `ray.init()` to have run in this process (or a Ray worker). The actor lives as long
    as the Ray job (`lifetime="detached"` is not used: the store dies with the job), on the
    node of the process that created it: left to Ray, it could land on any node, and a
    node lost (or one Ray has not noticed is gone yet) would take the rendezvous of every
    process with it.
    """

    def __init__(
        self,
        name: str = "rlinf-comm-store",
        *,
        namespace: str | None = None,
        timeout: float = DEFAULT_STORE_TIMEOUT_S,
    ) -> None:
        ray = _import_ray()
        if not ray.is_initialized():
            raise errors.CommError(
                "expected Ray to be initialised before creating a RayStore; got no Ray "
                "connection (call ray.init() first, or use TCPStore without Ray)"
            )
        self.name = name
        self.timeout = timeout
        self._ray = ray
        from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

        actor_cls = ray.remote(num_cpus=0, max_concurrency=1000)(_StoreActor)
        here = NodeAffinitySchedulingStrategy(ray.get_runtime_context().get_node_id(), soft=False)
        self._actor = actor_cls.options(
            name=name, namespace=namespace, get_if_exists=True, scheduling_strategy=here
        ).remote()

    def _get(self, ref: Any, timeout: float) -> Any:
        # The actor enforces `timeout` on waits; the client waits a little longer
        # (`reply_window`) so that a live actor's answer decides the outcome.
        try:
            return self._ray.get(ref, timeout=reply_window(timeout))
        except self._ray.exceptions.GetTimeoutError as exc:
            raise errors.CommTimeoutError(
                f"expected the Ray store actor {self.name!r} to answer within "
                f"{timeout:.3g} s; got nothing"
            ) from exc
        except self._ray.exceptions.RayActorError as exc:
            raise errors.PeerDiedError(f"the Ray store actor {self.name!r} died: {exc}") from exc

    def _limit(self, timeout: float | None) -> float:
        return check_timeout(self.timeout if timeout is None else timeout)

    def set(self, key: str, value: bytes, *, timeout: float | None = None) -> None:
        self._get(self._actor.set.remote(key, check_value(key, value)), self._limit(timeout))

    def get(self, key: str, *, timeout: float | None = None) -> bytes:
        check_value(key, b"")
        limit = self._limit(timeout)
        value = self._get(self._actor.get.remote(key, limit), limit)
        if value is None:
            raise errors.CommTimeoutError(
                f"expected store key {key!r} to be set within {limit:.3g} s; it is still missing"
            )
        return bytes(value)

    def wait(self, keys: Sequence[str], *, timeout: float | None = None) -> None:
        if isinstance(keys, str):
            raise TypeError(f"expected a sequence of keys; got the str {keys!r}")
        limit = self._limit(timeout)
        if not self._get(self._actor.wait.remote(list(keys), limit), limit):
            raise errors.CommTimeoutError(
                f"expected store keys {sorted(keys)} to be set within {limit:.3g} s; "
                "some are still missing"
            )

    def add(self, key: str, amount: int = 1, *, timeout: float | None = None) -> int:
        return int(self._get(self._actor.add.remote(key, int(amount)), self._limit(timeout)))

    def compare_set(self, key: str, expected: bytes | None, desired: bytes, *,
                    timeout: float | None = None) -> bytes:
        exp = None if expected is None else check_value(key, expected)
        ref = self._actor.compare_set.remote(key, exp, check_value(key, desired))
        return bytes(self._get(ref, self._limit(timeout)))

    def delete(self, key: str, *, timeout: float | None = None) -> bool:
        return bool(self._get(self._actor.delete.remote(key), self._limit(timeout)))

    def close(self) -> None:
        """Nothing to release per client: the actor lives as long as the Ray job."""

    def destroy(self) -> None:
        """Kill the actor now, for every client (its creator's teardown). Asks Ray without
        waiting for an answer, so it returns at once also when the cluster is gone."""
        self._ray.kill(self._actor, no_restart=True)

    def __repr__(self) -> str:
        return f"RayStore({self.name!r})"
