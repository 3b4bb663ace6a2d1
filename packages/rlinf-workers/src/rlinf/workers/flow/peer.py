"""`PeerChannel`: a ``transport="p2p"`` edge as its two single-rank ends use it.

A channel item costs round trips to the channel's owner (the put, then the consumer's
get and release); an `rlinf.comm.Endpoint.send` is one message straight to the peer's
endpoint (small numpy batches travel inline in the frame, and a blocking `recv` reads the
socket in the calling thread). For latency-bound exchanges — an env and its policy trading
one observation and one action batch per step and stage group — that difference is the
pipelining overhead, so such edges are declared ``ChannelSpec(transport="p2p")``.

Every flow process has one endpoint, named after its run, role and rank
(`endpoint_name`), so each end knows the other's name without a lookup. Messages carry
their edge and key in the batch metadata; a `get` files the messages of other edges or keys
it meets on the way (per source the order is FIFO, and a loop's protocol order is fixed,
so in practice the next message is the wanted one).
"""

from __future__ import annotations

import time
from collections import deque

from rlinf.comm import Batch, CommTimeoutError, Endpoint, PeerDiedError
from rlinf.workers.errors import WorkersError

__all__ = ["PeerChannel", "PeerGoneError", "PeerTimeoutError", "endpoint_name"]

_ROUTE = "flow_route"
"""Metadata entry that carries ``"<edge name>|<key>"``."""


class PeerTimeoutError(WorkersError, TimeoutError):
    """No message arrived from the peer within the timeout (it is stuck or dead)."""


class PeerGoneError(WorkersError, RuntimeError):
    """The peer's endpoint is gone (its process died or closed)."""


def endpoint_name(store: str, role: str, rank: int) -> str:
    """The endpoint name of `role`'s rank `rank` in the run whose store is `store`."""
    return f"{store}/{role}/{rank}"


class _Filed:
    """Messages from one peer that arrived while a `get` waited for another route."""

    def __init__(self) -> None:
        self.routes: dict[str, deque[Batch]] = {}


class PeerChannel:
    """One end of a p2p edge: `put` sends to the peer, `get` receives what it sent."""

    def __init__(self, endpoint: Endpoint, *, edge: str, peer: str, timeout: float,
                 filed: _Filed) -> None:
        self._endpoint = endpoint
        self._edge = edge
        self._peer = peer
        self._timeout = timeout
        self._filed = filed

    @staticmethod
    def mailbox() -> _Filed:
        """A store for messages filed away from one peer (share it between that peer's
        edges in this process)."""
        return _Filed()

    def put(self, item: Batch, *, key: str | None = None, weight: float = 1,
            timeout: float | None = None) -> None:
        """Send `item` under `key` (`weight` is accepted for channel compatibility)."""
        route = f"{self._edge}|{key}"
        try:
            self._endpoint.send(Batch(item.tensors, meta={**item.meta, _ROUTE: route}),
                                self._peer, timeout=self._timeout if timeout is None else timeout)
        except PeerDiedError as exc:
            raise PeerGoneError(f"peer {self._peer!r} of edge {self._edge!r} is gone; cannot "
                                f"send under key {key!r}: {exc}") from exc

    def get(self, *, key: str | None = None, timeout: float | None = None) -> Batch:
        """The next item the peer sent on this edge under `key`; `PeerTimeoutError` after
        `timeout` seconds (default: the flow's io timeout)."""
        route = f"{self._edge}|{key}"
        filed = self._filed.routes.get(route)
        if filed:
            return filed.popleft()
        limit = self._timeout if timeout is None else timeout
        deadline = time.monotonic() + limit
        while True:
            remaining = deadline - time.monotonic()
            try:
                batch = self._endpoint.recv(self._peer, timeout=max(remaining, 0.0))
            except CommTimeoutError:
                raise PeerTimeoutError(
                    f"expected a message on edge {self._edge!r} under key {key!r} from "
                    f"{self._peer!r} within {limit} s; none arrived (the peer is stuck or "
                    "dead)") from None
            except PeerDiedError as exc:
                raise PeerGoneError(f"peer {self._peer!r} died while this side waited on edge "
                                    f"{self._edge!r} under key {key!r}: {exc}") from exc
            got = str(batch.meta.get(_ROUTE))
            if got == route:
                return batch
            self._filed.routes.setdefault(got, deque()).append(batch)

    def disconnect(self) -> None:
        """Nothing to release (the process's endpoint closes with the worker)."""
