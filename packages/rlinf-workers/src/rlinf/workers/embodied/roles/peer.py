"""`PeerLink`: the env/policy protocol over rlinf.comm point-to-point messages.

A channel item costs two round trips to the channel's owner (put, then get); a
point-to-point `Endpoint.send` is one message straight to the peer's endpoint (small numpy
batches travel inline in the frame, and a blocking `recv` reads the socket in the calling
thread). At one micro-batch per stage group and step that difference is the pipelining
overhead, so `RoleLink(transport="p2p")` is the default and channels remain selectable.

Keys (stage groups) are carried in the batch's metadata; a `get` for one key files the
messages of other keys it meets on the way (each source is FIFO, and the protocol's order
is fixed, so in practice the next message always is the wanted one).
"""

from __future__ import annotations

import time
from collections import deque

from rlinf.comm import Batch, CommTimeoutError, Endpoint, PeerDiedError
from rlinf.workers.env.link import LinkClosedError, LinkTimeoutError

__all__ = ["KEY_META", "PeerLink"]

KEY_META = "link_key"
"""Metadata entry that carries the item's key."""


class PeerLink:
    """Sink and source between this process's endpoint and one peer endpoint."""

    def __init__(self, endpoint: Endpoint, peer: str, *, timeout: float) -> None:
        self._endpoint = endpoint
        self._peer = peer
        self._timeout = timeout
        self._filed: dict[str | None, deque[Batch]] = {}

    def put(self, item: Batch, *, key: str | None = None) -> None:
        """Send `item` under `key` to the peer (the arrays are copied or sent before return)."""
        try:
            self._endpoint.send(Batch(item.tensors, meta={**item.meta, KEY_META: key}),
                                self._peer, timeout=self._timeout)
        except PeerDiedError as exc:
            raise LinkClosedError(f"peer {self._peer!r} is gone; cannot send under key "
                                  f"{key!r}: {exc}") from exc

    def get(self, *, key: str | None = None, timeout: float | None = None) -> Batch:
        """The next item the peer sent under `key`; LinkTimeoutError after `timeout` s."""
        filed = self._filed.get(key)
        if filed:
            return filed.popleft()
        limit = self._timeout if timeout is None else timeout
        deadline = time.monotonic() + limit
        while True:
            remaining = deadline - time.monotonic()
            try:
                batch = self._endpoint.recv(self._peer, timeout=max(remaining, 0.0))
            except CommTimeoutError:
                raise LinkTimeoutError(
                    f"expected a micro-batch under key {key!r} from {self._peer!r} within "
                    f"{limit} s; none arrived (the peer is stuck or dead)") from None
            except PeerDiedError as exc:
                raise LinkClosedError(f"peer {self._peer!r} died while this side waited under "
                                      f"key {key!r}: {exc}") from exc
            got = batch.meta.get(KEY_META)
            if got == key:
                return batch
            self._filed.setdefault(got, deque()).append(batch)
