"""`Channel`: a named multi-producer multi-consumer queue of batches.

Large payloads do not pass through the channel's owner (`ChannelServer`): `put` copies the
batch once into a shared-memory segment of this process's endpoint (CUDA IPC for GPU
batches) and sends the owner a descriptor; `get` receives the descriptor and opens the
payload, zero-copy from shared memory on the same node, fetched from the producer's endpoint
over TCP from another node. When the consumer drops the returned arrays, a release travels
back through the owner to the producer, which reuses the segment.

Small items of plain numpy arrays (up to `EndpointConfig.eager_bytes`) travel *inline*: their
bytes go in the put's message, the owner keeps them, and a get hands them over (as views of
the received bytes); nothing is left in the producer, nothing is released.

Every message costs a wake-up of the other side, so the common paths take as few as they
can: a handle in the owner's own process calls the owner directly (`LocalPeer`) and, while
its get waits, reads the producers' connections itself; a producer elsewhere spends *credits*
(room the owner reserved for it, granted in a shared word on the owner's node) and sends its
put without waiting for an answer (see `channel_server` for the protocol); there, its small
puts go through a shared-memory ring rather than its connection (`put_ring`).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import math
import threading
import time
from collections.abc import Callable, Iterable, Sequence
from concurrent.futures import Future
from typing import Any

from rlinf.comm import errors
from rlinf.comm._internal import endpoint_layout as layout
from rlinf.comm._internal import names, wire
from rlinf.comm._internal.channel_server import DEFAULT_KEY, ChannelServer
from rlinf.comm._internal.credit import Credits, CreditWord
from rlinf.comm._internal.endpoint import Endpoint
from rlinf.comm._internal.local_rpc import LocalPeer
from rlinf.comm._internal.logs import get_logger
from rlinf.comm._internal.put_ring import RingWriter
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
    was only stalled (its items are then delivered as usual; nothing is lost). A put that
    finds room reserved for this handle (credit) waits for no answer: it returns once its
    message is sent, and the owner takes the items whenever it reads them (even after a
    close it had not told this handle about yet).
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
        self._sent_weight = 0.0
        self._sent_bytes = 0
        self._sent_lock = threading.Lock()
        self._store: Store | None = None  # the creator's handle unregisters the name
        # xids put through this handle and not yet released by their consumer
        self._outstanding: set[int] = set()
        self._released = threading.Condition()
        # Settles the race between a get giving up and its answer arriving.
        self._abandon_lock = threading.Lock()
        # An owner in this process is called directly, not over a loopback connection.
        here = server if server is not None else ChannelServer.in_process(address)
        self._here = here
        self._local = here is not None
        self._peer: RpcPeer | LocalPeer
        if here is not None:
            self._peer = here.local_peer(name=f"channel {name!r} owner",
                                         on_message=self._on_push, on_close=self._owner_gone)
        else:
            conn = wire.connect(address, token=endpoint.token,
                                timeout=endpoint.config.connect_timeout)
            self._peer = RpcPeer(
                conn, name=f"channel {name!r} owner", on_message=self._on_push,
                on_close=self._owner_gone,
            ).start()
        # Credits (see `channel_server`): room the owner reserved for this handle's puts,
        # which then go without waiting for an answer; on the owner's node it grants them
        # in a shared word, offered when the handle first waits for room (a handle that
        # only gets never makes one). A local handle has no round trip to save.
        self._credit = not self._local
        self._unsynced = False  # a cput went out since the owner last confirmed all
        self._closed_seen = False  # the owner said the channel was closed
        self._word_lock = threading.Lock()
        self._word_offered = False
        self._ring: RingWriter | None = None  # small puts to an owner on this node
        self._ring_offered = False
        self._credits = Credits(bounded=False)  # until the hello's answer says (an owner
        # that dies before it answers finds one to wake)
        reply, _ = self._peer.call(
            {"op": "hello", "endpoint": endpoint.info, "credit": self._credit}, timeout=30.0)
        self.maxsize = int(reply["maxsize"])
        self._credits = Credits(bounded=self.maxsize > 0)

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

        The arrays are copied once (into the message when small, else into shared memory);
        the caller may reuse them at once. With room reserved on credit the put returns as
        soon as the message is sent.
        """
        if not self._put_on_credit(item, weight, key, timeout):
            self.put_many([item], weights=[weight], key=key, timeout=timeout)

    def _put_on_credit(self, item: Item, weight: float, key: str | None,
                       timeout: float | None) -> bool:
        """The common put, lean: one small plain-numpy item sent on credit, inline. False
        when that does not apply (then the general path takes the item)."""
        if not self._credit or self._closed_seen:
            return False
        parts = layout.inline_item(item, self.endpoint.config.eager_bytes)
        if parts is None:
            return False
        w = float(weight)
        if not (w >= 0 and math.isfinite(w)):
            raise ValueError(f"expected finite weights >= 0; got {weight}")
        limit = self._timeout(timeout)
        if not self._credits.take(1) and not self._await_credit(limit):
            return False
        descriptor, buffers = parts
        if not self._ring_put(key, w, descriptor, buffers, limit):
            wire_item = {"w": w, "p": {"t": layout.INLINE, "d": descriptor},
                         "nb": len(buffers)}
            self._send_on_credit(key, [wire_item], buffers, [], limit)
        self._count_sent(w, sum(b.nbytes for b in buffers))
        return True

    def _ring_put(self, key: str | None, weight: float, descriptor: Header,
                  buffers: list[Any], limit: float) -> bool:
        """Put one small item (its room taken) through the ring to an owner on this node;
        False when there is no ring or the item does not go in (see `put_ring`)."""
        ring = self._ring
        if ring is None:
            if self._ring_offered or not isinstance(self._peer, RpcPeer):
                return False
            ring = self._offer_ring(limit)
            if ring is None:
                return False
        assert isinstance(self._peer, RpcPeer)
        if ring.doorbell_asked:  # a get sleeps: the frame itself wakes it, one message
            return False
        if not ring.try_put(self._peer.conn.frames_sent, key or DEFAULT_KEY, weight,
                            descriptor, buffers):
            return False
        self._unsynced = True
        if ring.doorbell_asked:  # it went to sleep meanwhile
            # Not sent when the connection is backed up: the owner then reads frames
            # already queued, and drains the ring before it handles them.
            with contextlib.suppress(errors.CommTimeoutError):
                self._peer.notify({"op": "ring"}, timeout=limit)
        return True

    def _offer_ring(self, limit: float) -> RingWriter | None:
        """Offer the owner a put ring (once per handle); the ring once it mapped it."""
        with self._word_lock:
            if self._ring is not None or self._ring_offered:
                return self._ring
            self._ring_offered = True
            ring = RingWriter.create(self.endpoint.config.eager_bytes)
            if ring is None:
                return None
            try:
                reply, _ = self._peer.call({"op": "put_ring", "offer": ring.offer()},
                                           timeout=limit)
                if reply.get("mapped"):
                    self._ring = ring
            except errors.CommTimeoutError:
                pass  # no answer in time: the connection it is
            finally:
                if self._ring is not ring:  # another node, no answer, or the owner is gone
                    ring.close()
            return self._ring

    def _count_sent(self, weight: float, nbytes: int) -> None:
        with self._sent_lock:
            self._sent_weight += weight
            self._sent_bytes += nbytes

    @property
    def sent(self) -> tuple[float, int]:
        """``(weight, bytes)``: the total weight and array bytes of the items this handle
        has put (what a message costs to move, per unit of weight)."""
        with self._sent_lock:
            return self._sent_weight, self._sent_bytes

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
        if self._closed_seen:
            raise errors.ChannelClosedError(
                f"expected an open channel {self.name!r} to put into; it is closed")
        wire_items, buffers, xids = self._export(items, ws)
        out: Future[tuple[Reply, list[int], float]] = Future()
        _set_deadline(out, limit)
        if self._credit and self._credits.take(len(items)):
            self._send_on_credit(key, wire_items, buffers, xids, limit)
            out.set_result((({"accepted": len(items)}, []), xids, limit))
            return out
        header: Header = {"op": "put", "key": key or DEFAULT_KEY, "timeout": limit,
                          "items": wire_items}
        if self._credit and self.maxsize > 0 and self._credits.word is None:
            header["want"] = self.maxsize
        call = self._peer.call_async(header, buffers)

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
            grant = int(f.result()[0].get("grant", 0))
            if grant > 0:
                self._credits.add(grant)
            out.set_result((f.result(), xids, limit))

        call.add_done_callback(done)
        return out

    def _await_credit(self, limit: float) -> bool:
        """Wait (up to `limit` s) for the owner to grant room for one item in the credit
        word; False without a word (the put then asks the owner itself). Raises
        CommTimeoutError when no room came: nothing went in."""
        def check() -> None:
            if self._closed_seen:
                raise errors.ChannelClosedError(
                    f"expected an open channel {self.name!r} to put into; it was closed")
            if self._peer.closed:
                raise errors.PeerDiedError(f"the owner of channel {self.name!r} is gone")

        def ask() -> None:
            self._peer.notify({"op": "want"})

        deadline = time.monotonic() + limit
        if self._credits.word is None and not self._offer_word(deadline):
            return False
        if not self._credits.wait_for_one(deadline, check=check, ask=ask):
            raise errors.CommTimeoutError(
                f"expected room for 1 item in channel {self.name!r} within {limit:.3g} s; "
                "only 0 went in")
        return True

    def _offer_word(self, deadline: float) -> bool:
        """Offer the owner a credit word (once per handle); True once it mapped one, False
        when it cannot (another node, no futexes: the put then asks it itself)."""
        with self._word_lock:
            if self._credits.word is not None or self._word_offered:
                return self._credits.word is not None
            self._word_offered = True
            word = CreditWord.create()
            if word is None:
                return False
            try:
                call = self._peer.call_async({"op": "credit_word", "offer": word.offer()})

                def settle(f: Future[Reply]) -> None:
                    # Also for a late answer: a word the owner mapped is the handle's.
                    if f.exception() is None and f.result()[0].get("mapped"):
                        self._credits.attach(word)
                    else:
                        word.close()

                call.add_done_callback(settle)
                if not call.done():
                    self._peer.read_direct(call.done, deadline=deadline)
                wait_future(call, timeout=max(deadline - time.monotonic(), 0.0),
                            what=f"an answer from the owner of channel {self.name!r}")
            finally:
                word.unlink()  # mapped by the owner by now, or it never will be
            return self._credits.word is not None

    def _send_on_credit(self, key: str | None, items: list[Header], buffers: list[Any],
                        xids: list[int], limit: float) -> None:
        """Send items whose room is reserved: no answer to wait for."""
        try:
            self._peer.notify({"op": "cput", "key": key or DEFAULT_KEY, "items": items},
                              buffers, timeout=limit)
        except errors.CommTimeoutError:  # nothing went out: the credits are still ours
            self._credits.refund(len(items))
            self._drop(xids)
            raise errors.CommTimeoutError(
                f"expected to send {len(items)} items to the owner of channel {self.name!r} "
                f"within {limit:.3g} s; none went in (its connection is backed up)") from None
        except BaseException:
            self._drop(xids)
            raise
        self._unsynced = True

    def _export(self, items: Sequence[Item], weights: list[float]
                ) -> tuple[list[Header], list[Any], list[int]]:
        """The put's wire items, the buffers of its inline payloads, and the ids of the
        payloads this process keeps for the consumer (released when consumed).

        Small plain-numpy items travel inline in the put's frame (the owner keeps the
        bytes); the others are exported into this process's shared memory (small ones
        packed together, see `Endpoint.export_payloads`).
        """
        batches = [Batch.of(item) for item in items]
        self._count_sent(sum(weights), sum(b.nbytes for b in batches))
        limit = self.endpoint.config.eager_bytes
        wire_items: list[Header] = []
        buffers: list[Any] = []
        kept = [i for i, b in enumerate(batches) if not layout.inline_eligible(b, limit)]
        exported = dict(zip(kept, self.endpoint.export_payloads([batches[i] for i in kept]),
                            strict=True))
        xids = [xid for xid, _ in exported.values()]
        with self._released:
            self._outstanding.update(xids)
        for i, (batch, weight) in enumerate(zip(batches, weights, strict=True)):
            if i in exported:
                wire_items.append({"w": weight, "p": exported[i][1]})
                continue
            descriptor, parts = layout.inline_parts(batch)
            if self._local:  # handed over in this process: the caller may reuse its arrays
                parts = layout.copy_aligned(parts)
            wire_items.append({"w": weight, "p": {"t": layout.INLINE, "d": descriptor},
                               "nb": len(parts)})
            buffers.extend(parts)
        return wire_items, buffers, xids

    def _wait_put(self, fut: Future[tuple[Reply, list[int], float]]) -> None:
        if not fut.done():
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

    def _on_push(self, peer: RpcPeer | LocalPeer, header: Header, buffers: Buffers) -> None:
        op = header.get("op")
        if op == "release":
            self._drop([int(x) for x in header["xids"]])
        elif op == "revoke":  # a put waits for room: give back what we did not spend
            try:
                peer.notify({"op": "return", "n": self._credits.give_back()})
            except errors.CommError as exc:  # owner gone: the credits went with it
                log.debug("channel_return_failed", channel=self.name, error=str(exc))
        elif op == "closed":
            self._closed_seen = True
            self._credits.wake()

    def _owner_gone(self, peer: RpcPeer | LocalPeer, exc: BaseException) -> None:
        with self._released:  # a waiting flush learns at once
            self._released.notify_all()
        self._credits.wake()

    def flush(self, *, timeout: float | None = None) -> None:
        """Wait until the owner has every item put through this handle, and those whose
        payloads stay in this process (shared memory) were consumed and released.

        Such payloads live in the producer's memory: call this before a producer exits,
        or its unconsumed items are lost (consumers then see PeerDiedError). Inline items
        live in the owner once it has them. Raises PeerDiedError as soon as the owner is
        gone (the items still out can no longer be consumed), CommTimeoutError when
        `timeout` runs out first.
        """
        limit = self._timeout(timeout)
        deadline = time.monotonic() + limit
        self._sync(limit)
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

    def _sync(self, limit: float) -> None:
        """Wait until the owner handled every put sent on credit (each frame in order)."""
        if not self._unsynced:
            return
        try:
            self._peer.call({"op": "sync"}, timeout=limit)
        except errors.PeerDiedError as exc:
            raise errors.PeerDiedError(
                f"expected the owner of channel {self.name!r} to take the items put through "
                f"this handle; the connection to it is closed ({exc})") from exc
        self._unsynced = False

    # -- get --------------------------------------------------------------------------
    def get(self, *, key: str | None = None, timeout: float | None = None) -> Batch:
        """Remove and return the oldest item under `key`, waiting for one if needed."""
        if self._here is not None:
            assert isinstance(self._peer, LocalPeer)
            self._timeout(timeout)  # refused when bad, whether or not an item waits
            item = self._here.take_local(self._peer, key or DEFAULT_KEY)
            if item is None:
                return self._open(self._get_here(key, None, timeout))[0]
            if item.inline:  # a stream's usual case: the shortest path
                return layout.open_inline(item.payload["d"], item.buffers)
            return self._open([(item.local_view(), item.buffers)])[0]
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
        if self._here is not None:
            return self._open(self._get_here(key, float(target_weight), timeout))
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

    def _get_here(self, key: str | None, target: float | None, timeout: float | None
                  ) -> list[tuple[Header, Buffers]]:
        """A get served by the owner in this process: no request is encoded, and while it
        waits this thread reads the producers' connections itself. (A single get first
        tries `ChannelServer.take_local`: see `get`.)"""
        assert self._here is not None and isinstance(self._peer, LocalPeer)
        limit = self._timeout(timeout)
        deadline = time.monotonic() + limit
        getter = self._here.get_local(self._peer, key=key or DEFAULT_KEY, target=target,
                                      timeout=limit)
        outcome = getter.outcome
        assert outcome is not None
        if not outcome.done():
            self._peer.read_direct(outcome.done, deadline=deadline)
            if not outcome.done():
                self._here.expire_local(getter, limit)
        return [(item.local_view(), item.buffers) for item in outcome.result()]

    def _get_async(
        self, key: str | None, target: float | None, timeout: float | None
    ) -> Future[Reply]:
        limit = self._timeout(timeout)
        header = {"op": "get", "key": key or DEFAULT_KEY, "target_weight": target,
                  "timeout": limit}
        fut = self._peer.call_async(header)
        _set_deadline(fut, limit)
        fut.rlinf_key = header["key"]  # type: ignore[attr-defined]
        fut.add_done_callback(self._return_if_abandoned)
        return fut

    def _wait_get(self, fut: Future[Reply]) -> list[tuple[Header, Buffers]]:
        self._peer.read_direct(fut.done, deadline=_deadline_of(fut))
        return self._settle_get(fut)

    def _settle_get(self, fut: Future[Reply]) -> list[tuple[Header, Buffers]]:
        """The items `fut` got, or CommTimeoutError once its deadline passed without an
        answer (the get is then abandoned: `_return_if_abandoned` hands back what a late
        answer brings)."""
        try:
            wait_future(
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
            reply, buffers = fut.result()  # answered at the last moment after all
        else:
            reply, buffers = fut.result()
        return _items_of(reply, buffers)

    def _open(self, items: Iterable[tuple[Header, Buffers]]) -> list[Batch]:
        batches = []
        pending = list(items)
        try:
            while pending:
                item, buffers = pending[0]
                if item["p"].get("t") == layout.INLINE:  # our own copy: nothing to release
                    batches.append(layout.open_inline(item["p"]["d"], buffers))
                else:
                    batches.append(self.endpoint.open_payload(
                        item["p"], producer=item["producer"],
                        on_release=self._releaser_of(int(item["uid"])),
                    ))
                pending.pop(0)
        except BaseException:
            # Items we could not open are released at once (they are not ours to keep).
            for item, _ in pending:
                if item["p"].get("t") != layout.INLINE:
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
        key = getattr(fut, "rlinf_key", DEFAULT_KEY)
        entries: list[Header] = []
        buffers: list[Any] = []
        for item, parts in _items_of(*fut.result()):
            if item["p"].get("t") == layout.INLINE:  # the bytes are here: they go back
                entries.append({"uid": item["uid"], "key": key, "w": item["w"],
                                "p": item["p"], "nb": len(parts)})
                buffers.extend(parts)
            else:
                entries.append({"uid": item["uid"]})
        if entries:
            log.warning("channel_late_items_returned", channel=self.name, items=len(entries))
            try:
                self._peer.notify({"op": "unget", "items": entries}, buffers)
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
        PeerDiedError. Items this handle put and nobody consumed are released; items sent
        on credit reach the owner first (waiting up to `EndpointConfig.close_timeout`)."""
        if self._unsynced and not self._peer.closed:
            try:
                self._sync(self.endpoint.config.close_timeout)
            except errors.CommError as exc:
                log.warning("channel_disconnect_unsynced", channel=self.name, error=str(exc))
        if not self._peer.closed:  # a clean leave: the owner does not take it for a crash
            with contextlib.suppress(errors.CommError):
                self._peer.notify({"op": "bye"})
        self._peer.close()
        self._credits.close()
        if self._ring is not None:
            self._ring.close()
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


def _items_of(reply: Header, buffers: Buffers) -> list[tuple[Header, Buffers]]:
    """A get's reply as (item, its inline buffers); items kept by their producer carry the
    producer's endpoint info."""
    producers = reply["producers"]
    out = []
    at = 0
    for entry in reply["items"]:
        nb = int(entry.get("nb", 0))
        item = {**entry, "producer": producers[entry["pr"]]} if "pr" in entry else entry
        out.append((item, buffers[at:at + nb]))
        at += nb
    return out


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
