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

Between two processes of one node the items of an edge travel through a shared-memory ring
(`rlinf.comm.ShmRing`) instead: the producer creates it at its first put and sends its offer
as an endpoint message, so the offer arrives after every message sent before it, and from
then on writes items into the ring's slots (a marshal header and the host arrays' raw
bytes, a few microseconds to encode and decode, against a framed socket message's tens).
An item that does not fit a slot, or holds device tensors, goes over the endpoint with a
marker in the ring to keep the order. A peer that dies surfaces as `PeerGoneError` naming
it, from the ring as from the endpoint.
"""

from __future__ import annotations

import contextlib
import json
import marshal
import math
import threading
import time
from collections import deque
from typing import Any

import numpy as np
import structlog
import torch

from rlinf.comm import (
    Batch,
    ChannelClosedError,
    CommError,
    CommTimeoutError,
    Endpoint,
    PeerDiedError,
    ShmRing,
)
from rlinf.workers.errors import WorkersError
from rlinf.workers.flow.channels import parse_store

__all__ = ["PeerChannel", "PeerGoneError", "PeerTimeoutError", "endpoint_name"]

_log = structlog.get_logger(__name__)

_ROUTE = "flow_route"
"""Metadata entry that carries ``"<edge name>|<key>"``."""
_RING_OFFER = "flow_ring_offer"
"""Metadata entry of the message that hands the consumer an edge's ring (JSON)."""
_ON_ENDPOINT = b"E"
"""A ring item saying "this edge's next item travels over the endpoint"."""
_NUMPY_SAFE = frozenset({torch.float16, torch.float32, torch.float64, torch.int8, torch.int16,
                         torch.int32, torch.int64, torch.uint8, torch.bool, torch.complex64,
                         torch.complex128})
"""Torch dtypes a numpy view can carry (bfloat16 and float8 cannot: the endpoint takes them)."""
_RING_SLOTS = 16
_MIN_SLOT_BYTES = 1 << 16
_MAX_SLOT_BYTES = 1 << 24


class PeerTimeoutError(WorkersError, TimeoutError):
    """No message arrived from the peer within the timeout (it is stuck or dead)."""


class PeerGoneError(WorkersError, RuntimeError):
    """The peer's endpoint is gone (its process died or closed)."""


def endpoint_name(store: str, role: str, rank: int) -> str:
    """The endpoint name of `role`'s rank `rank` in the run whose store is `store`."""
    return f"{parse_store(store)[0]}/{role}/{rank}"


class _Filed:
    """Messages from one peer that arrived while a `get` waited for another route, and
    the consumer ends of that peer's rings by edge.

    Gets may come from several threads at once (an env worker stepping its stage groups
    concurrently asks for each group's actions in its own thread): one of them at a time
    reads from the peer (`reading`) and files what others wait for, under `changed`."""

    def __init__(self) -> None:
        self.routes: dict[str, deque[Batch]] = {}
        self.rings: dict[str, ShmRing] = {}
        self.owed: dict[str, int] = {}
        """By edge: items its ring announced (`_ON_ENDPOINT`) not yet taken off the endpoint."""
        self.changed = threading.Condition()
        """Guards `routes` and `reading`; notified when an item is filed or the reader
        leaves."""
        self.reading = False
        """Whether a thread is reading from the peer now."""


def _encode(item: Batch, key: str | None) -> list[Any] | None:
    """An item as ring payload parts: the header's length, the header (marshal: key, meta,
    and name, dtype, shape, torch-ness per array) and each array's bytes. None if the item
    holds device tensors (the endpoint handles those). marshal and raw bytes cost a few
    microseconds where pickling the arrays costs tens."""
    arrays: list[np.ndarray] = []
    layout: list[tuple[str, str, tuple[int, ...], bool]] = []
    for name, value in item.tensors.items():
        is_torch = isinstance(value, torch.Tensor)
        if is_torch:
            if value.device.type != "cpu" or value.dtype not in _NUMPY_SAFE:
                return None
            host: Any = value.detach().numpy()
        else:
            host = value
        array = np.asarray(host, order="C")  # ascontiguousarray makes 0-d arrays 1-d
        if array.dtype.hasobject:
            return None
        arrays.append(array)
        layout.append((name, array.dtype.str, array.shape, is_torch))
    header = marshal.dumps((key, dict(item.meta), layout))
    return [len(header).to_bytes(4, "little"), header, *arrays]


def _decode(payload: bytearray, edge: str) -> tuple[str, Batch]:
    size = int.from_bytes(payload[:4], "little")
    key, meta, layout = marshal.loads(payload[4:4 + size])
    offset, tensors = 4 + size, {}
    for name, dtype, shape, is_torch in layout:
        array = np.frombuffer(payload, dtype=dtype, count=math.prod(shape),
                              offset=offset).reshape(shape)
        offset += array.nbytes
        tensors[name] = torch.from_numpy(array) if is_torch else array
    route = f"{edge}|{key}"
    meta[_ROUTE] = route
    return route, Batch.from_trusted(tensors, meta)


def _size(parts: list[Any]) -> int:
    return sum(memoryview(part).nbytes for part in parts)


def _slot_bytes(nbytes: int) -> int:
    """Slot size for items like one of `nbytes`: room for twice that, a power of two."""
    return min(max(_MIN_SLOT_BYTES, 1 << (2 * nbytes + 8).bit_length()), _MAX_SLOT_BYTES)


class PeerChannel:
    """One end of a p2p edge: `put` sends to the peer, `get` receives what it sent."""

    def __init__(self, endpoint: Endpoint, *, edge: str, peer: str, timeout: float,
                 filed: _Filed, shared_memory: bool = True) -> None:
        self._endpoint = endpoint
        self._edge = edge
        self._peer = peer
        self._timeout = timeout
        self._filed = filed
        self._ring: ShmRing | None = None
        self._try_ring = shared_memory
        """Whether the next put may still open a ring (until one is open or ruled out)."""
        self._put_lock = threading.Lock()
        """Puts from several threads go into the ring (or the endpoint) one at a time."""
        self._sent: tuple[float, int] = (0.0, 0)

    @staticmethod
    def mailbox() -> _Filed:
        """A store for messages filed away from one peer (share it between that peer's
        edges in this process)."""
        return _Filed()

    def put(self, item: Batch, *, key: str | None = None, weight: float = 1,
            timeout: float | None = None) -> None:
        """Send `item` under `key`; `weight` counts toward `sent`, as on a channel."""
        with self._put_lock:
            self._put(item, key, self._timeout if timeout is None else timeout)
            self._sent = (self._sent[0] + weight, self._sent[1] + item.nbytes)

    @property
    def sent(self) -> tuple[float, int]:
        """``(weight, bytes)`` of the items sent so far (`rlinf.comm.Channel.sent`)."""
        return self._sent

    def _put(self, item: Batch, key: str | None, limit: float) -> None:
        payload = _encode(item, key) if self._ring is not None or self._try_ring else None
        size = _size(payload) if payload is not None else 0
        try:
            if payload is not None and self._ring is None:
                self._open_ring(size, limit)
            if self._ring is not None:
                fits = payload is not None and size <= self._ring.capacity
                self._ring.put(payload if fits else _ON_ENDPOINT,  # type: ignore[arg-type]
                               timeout=limit)
                if fits:
                    return
            self._endpoint.send(Batch(item.tensors, meta={**item.meta,
                                                          _ROUTE: f"{self._edge}|{key}"}),
                                self._peer, timeout=limit)
        except PeerDiedError as exc:
            raise PeerGoneError(f"peer {self._peer!r} of edge {self._edge!r} is gone; cannot "
                                f"send under key {key!r}: {exc}") from exc
        except CommTimeoutError as exc:
            raise PeerTimeoutError(f"peer {self._peer!r} took no item of edge {self._edge!r} "
                                   f"within {limit} s (it is stuck or dead): {exc}") from exc

    def _open_ring(self, nbytes: int, timeout: float) -> None:
        """Open this edge's ring if the peer shares this node's memory, and offer it."""
        self._try_ring = False
        if not self._endpoint.shares_memory_with(self._peer, timeout=timeout):
            _log.debug("p2p_over_endpoint", edge=self._edge, peer=self._peer,
                       why="another node or pid namespace")
            return
        ring = ShmRing.create(slots=_RING_SLOTS, slot_bytes=_slot_bytes(nbytes),
                              peer=self._peer)
        _log.debug("p2p_ring_opened", edge=self._edge, peer=self._peer, ring=ring.name,
                   slot_bytes=ring.slot_bytes, slots=ring.slots)
        try:
            self._endpoint.send(Batch({}, meta={_ROUTE: f"{self._edge}|",
                                                _RING_OFFER: json.dumps(ring.offer())}),
                                self._peer, timeout=timeout)
        except BaseException:
            ring.close()
            raise
        self._ring = ring

    def get(self, *, key: str | None = None, timeout: float | None = None) -> Batch:
        """The next item the peer sent on this edge under `key`; `PeerTimeoutError` after
        `timeout` seconds (default: the flow's io timeout). Safe from several threads."""
        route = f"{self._edge}|{key}"
        limit = self._timeout if timeout is None else timeout
        deadline = time.monotonic() + limit
        filed = self._filed
        with filed.changed:
            while True:
                waiting = filed.routes.get(route)
                if waiting:
                    return waiting.popleft()
                if not filed.reading:
                    filed.reading = True  # this thread reads for everyone until it returns
                    break
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    raise self._timed_out(key, limit)
                filed.changed.wait(remaining)
        try:
            return self._read_until(route, key, limit, deadline)
        finally:
            with filed.changed:
                filed.reading = False
                filed.changed.notify_all()

    def _read_until(self, route: str, key: str | None, limit: float, deadline: float) -> Batch:
        """Read from the peer until an item of `route` arrives, filing the others (the
        calling thread is the reader)."""
        while True:
            remaining = max(deadline - time.monotonic(), 0.0)
            try:
                got, batch = self._next(remaining)
            except CommTimeoutError:
                raise self._timed_out(key, limit) from None
            except PeerDiedError as exc:
                raise PeerGoneError(f"peer {self._peer!r} died while this side waited on edge "
                                    f"{self._edge!r} under key {key!r}: {exc}") from exc
            except ChannelClosedError as exc:
                raise PeerGoneError(f"peer {self._peer!r} closed edge {self._edge!r} while "
                                    f"this side waited under key {key!r}: {exc}") from exc
            if got == route:
                return batch
            with self._filed.changed:
                self._filed.routes.setdefault(got, deque()).append(batch)
                self._filed.changed.notify_all()

    def _timed_out(self, key: str | None, limit: float) -> PeerTimeoutError:
        return PeerTimeoutError(
            f"expected a message on edge {self._edge!r} under key {key!r} from "
            f"{self._peer!r} within {limit} s; none arrived (the peer is stuck or dead)")

    def _next(self, timeout: float) -> tuple[str, Batch]:
        """The next item from the peer on this edge (ring) or any edge (endpoint)."""
        ring = self._filed.rings.get(self._edge)
        if ring is not None and not self._filed.owed.get(self._edge):
            payload = ring.get(timeout=timeout)
            if payload != _ON_ENDPOINT:
                return _decode(payload, self._edge)
            self._filed.owed[self._edge] = 1
        batch = self._endpoint.recv(self._peer, timeout=timeout)
        route = str(batch.meta.get(_ROUTE))
        edge = route.rpartition("|")[0]
        offer = batch.meta.get(_RING_OFFER)
        if offer is not None:
            self._filed.rings[edge] = ShmRing.attach(json.loads(str(offer)), peer=self._peer)
            return self._next(timeout)
        if self._filed.owed.get(edge):
            self._filed.owed[edge] -= 1
        return route, batch

    def disconnect(self) -> None:
        """Close this edge's ring ends (the process's endpoint closes with the worker)."""
        for ring in (self._ring, self._filed.rings.pop(self._edge, None)):
            if ring is not None:
                with contextlib.suppress(CommError):
                    ring.close()
        self._ring = None
