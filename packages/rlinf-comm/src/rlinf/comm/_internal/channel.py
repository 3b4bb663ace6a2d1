"""`Channel`: a named multi-producer multi-consumer queue of batches.

Only descriptors pass through the channel's owner (`ChannelServer`); payloads move over the
transports. `put` copies the batch once into a shared-memory segment of this process's
endpoint (CUDA IPC for GPU batches) and sends the owner a descriptor. `get` receives a
descriptor and opens the payload: zero-copy from shared memory on the same node, fetched
from the producer's endpoint over TCP from another node. When the consumer drops the
returned arrays, a release travels back through the owner to the producer, which reuses the
segment.
"""

from __future__ import annotations

import asyncio
import json
import math
import threading
import time
from collections.abc import Callable, Iterable, Sequence
from concurrent.futures import Future
from typing import Any

from rlinf.comm import errors
from rlinf.comm._internal import names, wire
from rlinf.comm._internal.channel_server import DEFAULT_KEY, ChannelServer
from rlinf.comm._internal.endpoint import Endpoint
from rlinf.comm._internal.logs import get_logger
from rlinf.comm._internal.rpc import Buffers, Header, Reply, RpcPeer, reply_window, wait_future
from rlinf.comm._internal.store import Store, check_timeout
from rlinf.comm.batch import Array, Batch

log = get_logger(__name__)

Item = Batch | dict[str, Array]



def _store_key(name: str) -> str:
    return f"rlinf/comm/channel/{name}"


class Channel:
    """A handle on the named channel; create it once, connect from anywhere.

    `maxsize` bounds the number of items queued over all keys (0: unbounded); `put`
    blocks while the channel is full. Items are FIFO per key; `key=None` is the default
    key. Each `put` item carries a `weight` (e.g. the number of sequences it holds) that
    `get_batch` sums. Every blocking call takes `timeout` (None: the endpoint's default)
    and raises CommTimeoutError when it runs out, within 10% and 50 ms of it whatever the
    owner does; a closed channel raises ChannelClosedError; a dead owner or producer raises
    PeerDiedError.

    The owner enforces each timeout itself, so a timed-out put was not enqueued and a
    timed-out get took nothing. Only when the owner does not answer at all (stopped, hung)
    does the caller give up on its own: items a late answer hands to a get that gave up go
    back to the head of their queue, and a put that gave up may still go in if the owner
    was only stalled (its items are then delivered as usual; nothing is lost).
    """

    def __init__(
        self,
        name: str,
        *,
        address: tuple[str, int],
        endpoint: Endpoint,
        server: ChannelServer | None = None,
    ) -> None:
        self.name = name
        self.endpoint = endpoint
        self._server = server
        self._store: Store | None = None  # the creator's handle unregisters the name
        # xids put through this handle and not yet released by their consumer
        self._outstanding: set[int] = set()
        self._released = threading.Condition()
        # Settles the race between a get giving up and its answer arriving.
        self._abandon_lock = threading.Lock()
        conn = wire.connect(address, token=endpoint.token, timeout=endpoint.config.connect_timeout)
        self._peer = RpcPeer(
            conn, name=f"channel {name!r} owner", on_message=self._on_push,
            on_close=self._owner_gone,
        ).start()
        reply, _ = self._peer.call({"op": "hello", "endpoint": endpoint.info}, timeout=30.0)
        self.maxsize = int(reply["maxsize"])

    # -- creation and lookup ----------------------------------------------------------
    @classmethod
    def create(
        cls,
        name: str,
        *,
        store: Store,
        maxsize: int = 0,
        endpoint: Endpoint | None = None,
    ) -> Channel:
        """Create the channel `name` and serve it from this process until `disconnect()`.

        Raises CommError if a live channel of that name exists; a dead owner's name (its
        process was killed) is taken over, and clients that connect by name reach this one.
        """
        ep = endpoint if endpoint is not None else Endpoint.current(store=store)
        server = ChannelServer(name, token=ep.token, maxsize=maxsize, host=ep.config.host)
        try:
            names.claim(store, _store_key(name), {"address": list(server.address)},
                        name=name, what="channel", token=ep.token)
        except BaseException:
            server.shutdown()
            raise
        try:
            channel = cls(name, address=server.address, endpoint=ep, server=server)
            channel._store = store
            return channel
        except BaseException:
            server.shutdown()
            store.delete(_store_key(name))
            raise

    @classmethod
    def connect(
        cls,
        name: str,
        *,
        store: Store,
        endpoint: Endpoint | None = None,
        timeout: float | None = None,
    ) -> Channel:
        """Connect to the channel `name`, waiting up to `timeout` s for it to be created."""
        ep = endpoint if endpoint is not None else Endpoint.current(store=store)
        record = json.loads(store.get(_store_key(name), timeout=timeout))
        host, port = record["address"]
        return cls(name, address=(str(host), int(port)), endpoint=ep)

    # -- put --------------------------------------------------------------------------
    def put(
        self,
        item: Item,
        *,
        weight: float = 1,
        key: str | None = None,
        timeout: float | None = None,
    ) -> None:
        """Append `item` under `key`; blocks while the channel is full.

        The arrays are copied once, into shared memory; the caller may reuse them at once.
        """
        self.put_many([item], weights=[weight], key=key, timeout=timeout)

    def put_many(
        self,
        items: Sequence[Item],
        *,
        weights: Sequence[float] | None = None,
        key: str | None = None,
        timeout: float | None = None,
    ) -> None:
        """Append several items under `key` with one round trip to the owner (in order).

        On timeout or close the items that did not fit are released and the error says how
        many went in; those that went in stay in the channel.
        """
        self._wait_put(self._put_async(items, weights, key, timeout))

    async def async_put(
        self, item: Item, *, weight: float = 1, key: str | None = None,
        timeout: float | None = None,
    ) -> None:
        """`put` for asyncio: the event loop keeps running while the channel is full."""
        fut = self._put_async([item], [weight], key, timeout)
        await _wait_until(fut)
        self._check_put(fut)

    def _put_async(
        self,
        items: Sequence[Item],
        weights: Sequence[float] | None,
        key: str | None,
        timeout: float | None,
    ) -> Future[tuple[Reply, list[int], float]]:
        ws = [1.0] * len(items) if weights is None else [float(w) for w in weights]
        if len(ws) != len(items):
            raise ValueError(f"expected {len(items)} weights, one per item; got {len(ws)}")
        for w in ws:
            if not math.isfinite(w) or w < 0:
                raise ValueError(f"expected finite weights >= 0; got {w}")
        limit = self._timeout(timeout)
        exported = self.endpoint.export_payloads([Batch.of(item) for item in items])
        xids = [xid for xid, _ in exported]
        payloads = [payload for _, payload in exported]
        with self._released:
            self._outstanding.update(xids)
        header = {
            "op": "put", "key": key or DEFAULT_KEY, "timeout": limit,
            "items": [{"w": w, "p": p} for w, p in zip(ws, payloads, strict=True)],
        }
        out: Future[tuple[Reply, list[int], float]] = Future()
        _set_deadline(out, limit)
        call = self._peer.call_async(header)

        def done(f: Future[Reply]) -> None:
            # Runs whether or not a caller still waits (a late answer after the caller gave
            # up): the items the owner did not take are ours to release.
            exc = f.exception()
            if exc is not None:
                self._drop(xids)
                out.set_exception(exc)
                return
            accepted = int(f.result()[0]["accepted"])
            if accepted < len(xids):
                self._drop(xids[accepted:])
            out.set_result((f.result(), xids, limit))

        call.add_done_callback(done)
        return out

    def _wait_put(self, fut: Future[tuple[Reply, list[int], float]]) -> None:
        self._peer.read_direct(fut.done, deadline=_deadline_of(fut))
        self._check_put(fut)

    def _check_put(self, fut: Future[tuple[Reply, list[int], float]]) -> None:
        try:
            (reply, _), xids, limit = wait_future(
                fut, timeout=max(_deadline_of(fut) - time.monotonic(), 0.0),
                what=f"an answer from the owner of channel {self.name!r} (stopped or hung? "
                     "if it was only stalled, the items may still go in)",
                limit=_limit_of(fut))
        except errors.CommTimeoutError:
            if not fut.done():
                log.warning("channel_owner_silent", channel=self.name, op="put",
                            timeout=_limit_of(fut))
            raise
        accepted = int(reply["accepted"])
        if reply.get("timed_out"):
            raise errors.CommTimeoutError(
                f"expected room for {len(xids)} items in channel {self.name!r} within "
                f"{limit:.3g} s; only {accepted} went in"
            )

    def _drop(self, xids: list[int]) -> None:
        with self._released:
            self._outstanding.difference_update(xids)
            self._released.notify_all()
        self.endpoint.release_exports(xids)

    def _on_push(self, peer: RpcPeer, header: Header, buffers: Buffers) -> None:
        if header.get("op") == "release":
            self._drop([int(x) for x in header["xids"]])

    def _owner_gone(self, peer: RpcPeer, exc: BaseException) -> None:
        with self._released:  # a waiting flush learns at once
            self._released.notify_all()

    def flush(self, *, timeout: float | None = None) -> None:
        """Wait until every item put through this handle was consumed and released.

        A producer's payloads live in its own memory: call this before a producer exits,
        or its unconsumed items are lost (consumers then see PeerDiedError). Raises
        PeerDiedError as soon as the owner is gone (the items still out can no longer be
        consumed), CommTimeoutError when `timeout` runs out first.
        """
        limit = self._timeout(timeout)
        deadline = time.monotonic() + limit
        with self._released:
            while self._outstanding:
                # Checked under the lock that `_owner_gone` notifies with: no lost wake-up.
                if self._peer.closed:
                    raise errors.PeerDiedError(
                        f"expected the consumers of channel {self.name!r} to release every "
                        f"item; the connection to its owner is closed (the owner died or "
                        f"this handle disconnected) with {len(self._outstanding)} still out"
                    )
                left = deadline - time.monotonic()
                if left <= 0:
                    raise errors.CommTimeoutError(
                        f"expected the consumers of channel {self.name!r} to release every "
                        f"item within {limit:.3g} s; {len(self._outstanding)} are still out"
                    )
                self._released.wait(left)

    # -- get --------------------------------------------------------------------------
    def get(self, *, key: str | None = None, timeout: float | None = None) -> Batch:
        """Remove and return the oldest item under `key`, waiting for one if needed."""
        return self._open(self._wait_get(self._get_async(key, None, timeout)))[0]

    def get_batch(
        self, *, target_weight: float, key: str | None = None, timeout: float | None = None
    ) -> list[Batch]:
        """Remove the oldest items under `key` until their weights sum to `target_weight`.

        Items are reserved as they arrive (the channel's room frees at once); on timeout
        the reserved items go back, in order, to the head of the key's queue. A closed
        channel returns what is left (less than the target) before raising
        ChannelClosedError on the next call.
        """
        if not target_weight > 0:
            raise ValueError(f"expected target_weight > 0; got {target_weight}")
        return self._open(self._wait_get(self._get_async(key, target_weight, timeout)))

    async def async_get(self, *, key: str | None = None, timeout: float | None = None) -> Batch:
        """`get` for asyncio."""
        fut = self._get_async(key, None, timeout)
        await _wait_until(fut)
        return self._open(self._settle_get(fut))[0]

    async def async_get_batch(
        self, *, target_weight: float, key: str | None = None, timeout: float | None = None
    ) -> list[Batch]:
        """`get_batch` for asyncio."""
        if not target_weight > 0:
            raise ValueError(f"expected target_weight > 0; got {target_weight}")
        fut = self._get_async(key, target_weight, timeout)
        await _wait_until(fut)
        return self._open(self._settle_get(fut))

    def _get_async(
        self, key: str | None, target: float | None, timeout: float | None
    ) -> Future[Reply]:
        limit = self._timeout(timeout)
        header = {"op": "get", "key": key or DEFAULT_KEY, "target_weight": target,
                  "timeout": limit}
        fut = self._peer.call_async(header)
        _set_deadline(fut, limit)
        fut.add_done_callback(self._return_if_abandoned)
        return fut

    def _wait_get(self, fut: Future[Reply]) -> list[Header]:
        self._peer.read_direct(fut.done, deadline=_deadline_of(fut))
        return self._settle_get(fut)

    def _settle_get(self, fut: Future[Reply]) -> list[Header]:
        """The items `fut` got, or CommTimeoutError once its deadline passed without an
        answer (the get is then abandoned: `_return_if_abandoned` hands back what a late
        answer brings)."""
        try:
            reply, _ = wait_future(
                fut, timeout=max(_deadline_of(fut) - time.monotonic(), 0.0),
                what=f"an answer from the owner of channel {self.name!r} (stopped or hung?)",
                limit=_limit_of(fut))
        except errors.CommTimeoutError:
            with self._abandon_lock:
                if not fut.done():
                    fut.rlinf_abandoned = True  # type: ignore[attr-defined]
                    log.warning("channel_owner_silent", channel=self.name, op="get",
                                timeout=_limit_of(fut))
                    raise
            reply, _ = fut.result()  # answered at the last moment after all
        producers = reply["producers"]
        return [{**item, "producer": producers[item["pr"]]} for item in reply["items"]]

    def _open(self, items: Iterable[Header]) -> list[Batch]:
        batches = []
        pending = list(items)
        try:
            while pending:
                item = pending[0]
                batches.append(self.endpoint.open_payload(
                    item["p"], producer=item["producer"],
                    on_release=self._releaser_of(int(item["uid"])),
                ))
                pending.pop(0)
        except BaseException:
            # Items we could not open are released at once (they are not ours to keep).
            for item in pending:
                self.endpoint.post_release(self._peer, "uids", int(item["uid"]))
            raise
        return batches

    def _return_if_abandoned(self, fut: Future[Reply]) -> None:
        """A late answer to a get whose caller gave up: its items go back to the head of
        their queue (in order), where the next get finds them."""
        with self._abandon_lock:
            if not getattr(fut, "rlinf_abandoned", False):
                return
        if fut.exception() is not None:
            return
        uids = [int(item["uid"]) for item in fut.result()[0].get("items", ())]
        if uids:
            log.warning("channel_late_items_returned", channel=self.name, items=len(uids))
            try:
                self._peer.notify({"op": "unget", "uids": uids})
            except errors.CommError as exc:  # owner gone: its queue went with it
                log.debug("channel_unget_failed", channel=self.name, error=str(exc))

    def _releaser_of(self, uid: int) -> Callable[[], None]:
        def release() -> None:  # may run in a GC callback: only queues the ack
            self.endpoint.post_release(self._peer, "uids", uid)

        return release

    # -- state ------------------------------------------------------------------------
    def qsize(self, *, key: str | None = None, timeout: float | None = None) -> int:
        """Items queued under `key`, or over all keys when `key` is None."""
        return int(self._stat(key, timeout)["qsize"])

    def weight(self, *, key: str | None = None, timeout: float | None = None) -> float:
        """Summed weight queued under `key`, or over all keys when `key` is None."""
        return float(self._stat(key, timeout)["weight"])

    def empty(self, *, key: str | None = None, timeout: float | None = None) -> bool:
        return self.qsize(key=key, timeout=timeout) == 0

    def full(self) -> bool:
        """True while a `put` would block (only with `maxsize` > 0)."""
        return self.maxsize > 0 and self.qsize() >= self.maxsize

    @property
    def closed(self) -> bool:
        return bool(self._stat(None)["closed"])

    def _stat(self, key: str | None, timeout: float | None = None) -> Header:
        reply, _ = self._peer.call({"op": "stat", "key": key}, timeout=self._timeout(timeout))
        return reply

    def _timeout(self, timeout: float | None) -> float:
        return check_timeout(self.endpoint.config.timeout if timeout is None else timeout)

    # -- lifecycle --------------------------------------------------------------------
    def close(self, *, timeout: float | None = None) -> None:
        """Close the channel for everyone: puts fail, gets drain what is left, then fail."""
        self._peer.call({"op": "close"}, timeout=self._timeout(timeout))

    def disconnect(self) -> None:
        """Drop this handle. The creator's handle also stops the owner: others then see
        PeerDiedError. Items this handle put and nobody consumed are released."""
        self._peer.close()
        if self._outstanding:
            self.endpoint.release_exports(list(self._outstanding))
            self._outstanding.clear()
        if self._server is not None:
            self._server.shutdown()
            self._server = None
            if self._store is not None:
                try:
                    self._store.delete(_store_key(self.name))
                except errors.CommError as exc:  # the store may be gone first at shutdown
                    log.debug("channel_unregister_failed", channel=self.name, error=str(exc))

    def __enter__(self) -> Channel:
        return self

    def __exit__(self, *exc: object) -> None:
        self.disconnect()

    def __repr__(self) -> str:
        role = "owner" if self._server is not None else "client"
        return f"Channel({self.name!r}, {role}, maxsize={self.maxsize})"


def _set_deadline(fut: Future[Any], limit: float) -> None:
    """Stamp a request's future with its timeout and the moment its caller gives up."""
    fut.rlinf_limit = limit  # type: ignore[attr-defined]
    fut.rlinf_deadline = time.monotonic() + reply_window(limit)  # type: ignore[attr-defined]


def _limit_of(fut: Future[Any]) -> float:
    return float(getattr(fut, "rlinf_limit", 0.0))


def _deadline_of(fut: Future[Any]) -> float:
    return float(getattr(fut, "rlinf_deadline", 0.0))


async def _wait_until(fut: Future[Any]) -> None:
    """Await `fut` without blocking the event loop, up to its deadline (no exception:
    the caller settles the outcome)."""
    left = max(_deadline_of(fut) - time.monotonic(), 0.0)
    wrapped = asyncio.wrap_future(fut)
    await asyncio.wait([wrapped], timeout=left)
    if not wrapped.done():  # a late answer is settled by `fut`'s callbacks, not here
        wrapped.add_done_callback(lambda f: f.cancelled() or f.exception())
