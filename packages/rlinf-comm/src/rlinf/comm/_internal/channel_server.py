"""The owner of a channel: a queue of item *descriptors*, never of payloads.

A `ChannelServer` runs as threads in the process that created the channel and listens on its
own authenticated port (published in the store). Producers send descriptors (where the
payload lies: a shared-memory segment, the producer's endpoint); consumers receive them and
open the payload themselves. The server also routes release acknowledgements from consumers
back to the producer that owns the payload, and cleans up after clients that die:

- a consumer dies: the payloads it took but never released are released to their producers;
- a producer dies: its queued items are dropped (their payloads died with it) and the next
  `get` on each affected key raises PeerDiedError naming the producer.

Ordering is FIFO per key. Back-pressure: `maxsize` bounds the number of items queued over
all keys (0: unbounded); a put that does not fit waits (FIFO) until consumers make room.
Every parked request carries a deadline that the server enforces, so a timed-out put was
never enqueued and a timed-out get took nothing: nothing is lost or duplicated.

Protocol (JSON headers, requests carry `id`, replies `re`):
  hello {endpoint}                          -> {maxsize}
  put {key, items: [{w, p}], timeout}       -> {accepted, timed_out?}
  get {key, target_weight|null, timeout}    -> {items: [{uid, w, p, pr}], producers}
  release {uids}                            (one way; forwarded as release {xids} to producers)
  unget {uids}                              (one way: items a get that gave up was handed
                                             late go back to the head of their queues)
  close {} -> {};  stat {key|null} -> {qsize, weight, closed, maxsize};  whoami {} -> {name}
"""

from __future__ import annotations

import itertools
import threading
import time
from collections import deque
from dataclasses import dataclass, field
from typing import Any

from rlinf.comm import errors
from rlinf.comm._internal.logs import get_logger
from rlinf.comm._internal.rpc import Buffers, Deadlines, Header, RpcPeer, RpcServer
from rlinf.comm._internal.store import check_timeout

log = get_logger(__name__)

DEFAULT_KEY = "default"


@dataclass(eq=False)
class _Item:
    uid: int
    key: str
    weight: float
    payload: Any  # the producer's descriptor (JSON), opaque to the server
    producer: RpcPeer

    def wire(self, producers: dict[RpcPeer, int]) -> Header:
        """The item as a consumer sees it; `producers` numbers the producers of a reply
        (each producer's endpoint info is sent once per reply, not once per item)."""
        index = producers.setdefault(self.producer, len(producers))
        return {"uid": self.uid, "w": self.weight, "p": self.payload, "pr": index}


@dataclass(eq=False)
class _Getter:
    peer: RpcPeer
    request: Header
    key: str
    target: float | None  # None: exactly one item
    items: list[_Item] = field(default_factory=list)
    weight: float = 0.0
    handle: int | None = None

    def satisfied(self) -> bool:
        if self.target is None:
            return len(self.items) == 1
        return self.weight >= self.target


@dataclass(eq=False)
class _Putter:
    peer: RpcPeer
    request: Header
    key: str
    pending: deque[tuple[float, Any]]
    accepted: int = 0
    handle: int | None = None


@dataclass(eq=False)
class _Client:
    delivered: dict[int, _Item] = field(default_factory=dict)
    dead: bool = False


class ChannelServer:
    """Serves one named channel; see the module docstring for the semantics."""

    def __init__(self, name: str, *, token: bytes, maxsize: int = 0, host: str = "127.0.0.1"):
        if maxsize < 0:
            raise ValueError(f"expected maxsize >= 0 (0: unbounded); got {maxsize}")
        self.name = name
        self.maxsize = maxsize
        self._queues: dict[str, deque[_Item]] = {}
        self._count = 0
        self._getters: dict[str, deque[_Getter]] = {}
        self._putters: deque[_Putter] = deque()
        self._clients: dict[RpcPeer, _Client] = {}
        self._losses: dict[str, list[str]] = {}  # key -> why its items were lost
        self._closed = False
        self._uids = itertools.count(1)
        self._lock = threading.RLock()
        self._deadlines = Deadlines(name=f"channel-{name}")
        self._server = RpcServer(
            name=f"channel-{name}", token=token, host=host,
            on_message=self._handle, on_close=self._client_died,
        )

    @property
    def address(self) -> tuple[str, int]:
        return self._server.address

    def shutdown(self) -> None:
        """Stop serving; connected clients see PeerDiedError."""
        self._server.close()
        self._deadlines.close()

    # -- dispatch ---------------------------------------------------------------------
    def _handle(self, peer: RpcPeer, header: Header, buffers: Buffers) -> None:
        op = header.get("op")
        with self._lock:
            client = self._clients.setdefault(peer, _Client())
            if op == "put":
                self._put(peer, header)
            elif op == "get":
                self._get(peer, header)
            elif op == "release":
                self._release(client, [int(u) for u in header["uids"]])
            elif op == "unget":
                self._unget(client, [int(u) for u in header["uids"]])
            elif op == "hello":
                peer.info = dict(header)
                peer.name = f"{self.name}<-{header.get('endpoint', {}).get('name', '?')}"
                peer.reply(header, {"maxsize": self.maxsize})
            elif op == "whoami":  # a newcomer asking for our name checks we are alive
                peer.reply(header, {"name": self.name})
            elif op == "stat":
                peer.reply(header, self._stat(header.get("key")))
            elif op == "close":
                self._close()
                peer.reply(header, {})
            else:
                peer.reply_error(header, errors.CommError(f"expected a channel op; got {op!r}"))

    def _stat(self, key: str | None) -> Header:
        if key is None:
            qsize = self._count
            weight = sum(i.weight for q in self._queues.values() for i in q)
        else:
            queue = self._queues.get(key, deque())
            qsize, weight = len(queue), sum(i.weight for i in queue)
        return {"qsize": qsize, "weight": weight, "closed": self._closed, "maxsize": self.maxsize}

    # -- put --------------------------------------------------------------------------
    def _put(self, peer: RpcPeer, request: Header) -> None:
        if self._closed:
            peer.reply_error(request, errors.ChannelClosedError(
                f"expected an open channel {self.name!r} to put into; it is closed"))
            return
        key = str(request.get("key") or DEFAULT_KEY)
        try:
            timeout = check_timeout(request.get("timeout"))
        except errors.InvalidArgumentError as exc:
            peer.reply_error(request, exc)
            return
        pending = deque((float(it["w"]), it["p"]) for it in request["items"])
        putter = _Putter(peer, request, key, pending)
        self._admit(putter)
        if putter.pending:
            self._putters.append(putter)
            putter.handle = self._deadlines.schedule(
                time.monotonic() + timeout, lambda: self._expire_put(putter)
            )
        else:
            peer.reply(request, {"accepted": putter.accepted})

    def _has_room(self) -> bool:
        return self.maxsize == 0 or self._count < self.maxsize

    def _admit(self, putter: _Putter) -> None:
        while putter.pending and self._has_room():
            weight, payload = putter.pending.popleft()
            item = _Item(next(self._uids), putter.key, weight, payload, putter.peer)
            putter.accepted += 1
            self._offer(item)

    def _offer(self, item: _Item) -> None:
        """Give `item` to the first waiting getter of its key, else queue it."""
        getters = self._getters.get(item.key)
        if getters:
            getter = getters[0]
            getter.items.append(item)
            getter.weight += item.weight
            if getter.satisfied():
                getters.popleft()
                self._deliver(getter)
            return
        self._queues.setdefault(item.key, deque()).append(item)
        self._count += 1

    def _expire_put(self, putter: _Putter) -> None:
        with self._lock:
            if putter not in self._putters:
                return
            self._putters.remove(putter)
        putter.peer.reply(putter.request, {"accepted": putter.accepted, "timed_out": True})

    def _make_room(self) -> None:
        """After items left the queue: let parked puts in, in arrival order."""
        while self._putters and self._has_room():
            putter = self._putters[0]
            self._admit(putter)
            if putter.pending:
                return
            self._putters.popleft()
            if putter.handle is not None:
                self._deadlines.cancel(putter.handle)
            putter.peer.reply(putter.request, {"accepted": putter.accepted})

    # -- get --------------------------------------------------------------------------
    def _get(self, peer: RpcPeer, request: Header) -> None:
        key = str(request.get("key") or DEFAULT_KEY)
        try:
            timeout = check_timeout(request.get("timeout"))
        except errors.InvalidArgumentError as exc:
            peer.reply_error(request, exc)
            return
        target = request.get("target_weight")
        getter = _Getter(peer, request, key, None if target is None else float(target))
        if self._raise_loss(getter):
            return
        queue = self._queues.get(key)
        waiting = self._getters.get(key)
        # Getters already waiting on this key go first (FIFO among consumers).
        while queue and not waiting and not getter.satisfied():
            item = queue.popleft()
            self._count -= 1
            getter.items.append(item)
            getter.weight += item.weight
        if getter.items:
            self._make_room()
        if getter.satisfied() or (self._closed and getter.items):
            self._deliver(getter)
        elif self._closed:
            peer.reply_error(request, self._closed_error(key))
        else:
            self._getters.setdefault(key, deque()).append(getter)
            getter.handle = self._deadlines.schedule(
                time.monotonic() + timeout, lambda: self._expire_get(getter, timeout)
            )

    def _closed_error(self, key: str) -> errors.ChannelClosedError:
        return errors.ChannelClosedError(
            f"expected an item under key {key!r} of channel {self.name!r}; "
            "the channel is closed and that key is drained"
        )

    def _deliver(self, getter: _Getter) -> None:
        if getter.handle is not None:
            self._deadlines.cancel(getter.handle)
        client = self._clients.get(getter.peer)
        if client is None or client.dead:
            self._requeue_front(getter.items)
            return
        for item in getter.items:
            client.delivered[item.uid] = item
        producers: dict[RpcPeer, int] = {}
        items = [i.wire(producers) for i in getter.items]
        infos = [p.info.get("endpoint") for p in producers]  # dicts keep insertion order
        getter.peer.reply(getter.request, {"items": items, "producers": infos})

    def _requeue_front(self, items: list[_Item]) -> None:
        """Put reserved items back at the head of their queues (order preserved)."""
        for item in reversed(items):
            self._queues.setdefault(item.key, deque()).appendleft(item)
            self._count += 1

    def _expire_get(self, getter: _Getter, timeout: float) -> None:
        with self._lock:
            waiting = self._getters.get(getter.key)
            if not waiting or getter not in waiting:
                return
            waiting.remove(getter)
            # A get_batch that gathered part of its weight gives it back, untouched.
            self._requeue_front(getter.items)
            self._serve_waiting(getter.key)
        got = f"weight {getter.weight:g} of {getter.target:g}" if getter.target else "nothing"
        getter.peer.reply_error(getter.request, errors.CommTimeoutError(
            f"expected an item under key {getter.key!r} of channel {self.name!r} within "
            f"{timeout:.3g} s; got {got}"
        ))

    def _serve_waiting(self, key: str) -> None:
        """Hand queued items of `key` to waiting getters (after a requeue)."""
        queue = self._queues.get(key)
        waiting = self._getters.get(key)
        while queue and waiting:
            item = queue.popleft()
            self._count -= 1
            getter = waiting[0]
            getter.items.append(item)
            getter.weight += item.weight
            if getter.satisfied():
                waiting.popleft()
                self._deliver(getter)

    def _raise_loss(self, getter: _Getter) -> bool:
        lost = self._losses.pop(getter.key, None)
        if not lost:
            return False
        getter.peer.reply_error(getter.request, errors.PeerDiedError(
            f"expected items under key {getter.key!r} of channel {self.name!r}; "
            + "; ".join(lost)
        ))
        return True

    # -- release, close, client death ---------------------------------------------------
    def _release(self, client: _Client, uids: list[int]) -> None:
        by_producer: dict[RpcPeer, list[Any]] = {}
        for uid in uids:
            item = client.delivered.pop(uid, None)
            if item is not None:
                by_producer.setdefault(item.producer, []).append(item.payload.get("xid"))
        for producer, xids in by_producer.items():
            if producer.closed:
                continue
            try:
                producer.notify({"op": "release", "xids": xids})
            except errors.CommError:
                log.debug("release_to_dead_producer", channel=self.name, producer=producer.name)

    def _unget(self, client: _Client, uids: list[int]) -> None:
        """Items delivered to a get whose caller had given up (its owner answered after the
        caller's deadline) go back, in order, to the head of their queues."""
        items = [item for uid in uids if (item := client.delivered.pop(uid, None)) is not None]
        self._requeue_front(items)
        for key in {item.key for item in items}:
            self._serve_waiting(key)

    def _close(self) -> None:
        if self._closed:
            return
        self._closed = True
        log.debug("channel_closed", channel=self.name)
        for putter in self._putters:
            if putter.handle is not None:
                self._deadlines.cancel(putter.handle)
            putter.peer.reply_error(putter.request, errors.ChannelClosedError(
                f"expected to put into channel {self.name!r}; it was closed after "
                f"{putter.accepted} of the items were accepted"
            ))
        self._putters.clear()
        for key, waiting in self._getters.items():
            for getter in waiting:
                if getter.items:
                    self._deliver(getter)  # what is there is what the caller gets
                else:
                    if getter.handle is not None:
                        self._deadlines.cancel(getter.handle)
                    getter.peer.reply_error(getter.request, self._closed_error(key))
            waiting.clear()

    def _client_died(self, peer: RpcPeer, exc: BaseException) -> None:
        with self._lock:
            client = self._clients.pop(peer, None)
            if client is None:
                return
            client.dead = True
            who = peer.info.get("endpoint", {}).get("name", peer.name)
            # Payloads it took and never released go back to their producers.
            self._release(client, list(client.delivered))
            # Its parked requests go away; reserved items return to the queues.
            self._putters = deque(p for p in self._putters if p.peer is not peer)
            for key, waiting in self._getters.items():
                for getter in [g for g in waiting if g.peer is peer]:
                    waiting.remove(getter)
                    if getter.handle is not None:
                        self._deadlines.cancel(getter.handle)
                    self._requeue_front(getter.items)
                self._serve_waiting(key)
            self._drop_items_of(peer, who)
            self._make_room()
        log.debug("channel_client_gone", channel=self.name, client=who, reason=str(exc))

    def _drop_items_of(self, producer: RpcPeer, who: str) -> None:
        """A dead producer's queued items cannot be opened any more: drop and report them."""
        for key, queue in self._queues.items():
            kept = deque(i for i in queue if i.producer is not producer)
            lost = len(queue) - len(kept)
            if lost:
                self._queues[key] = kept
                self._count -= lost
                self._losses.setdefault(key, []).append(
                    f"producer {who!r} died and {lost} of its queued items were lost"
                )
        for key, waiting in self._getters.items():
            for getter in list(waiting):
                mine = [i for i in getter.items if i.producer is producer]
                if not mine:
                    continue
                waiting.remove(getter)
                if getter.handle is not None:
                    self._deadlines.cancel(getter.handle)
                self._requeue_front([i for i in getter.items if i.producer is not producer])
                getter.peer.reply_error(getter.request, errors.PeerDiedError(
                    f"expected items under key {key!r} of channel {self.name!r}; producer "
                    f"{who!r} died and {len(mine)} of the items gathered for this call were lost"
                ))
        # A consumer already waiting on an affected key learns at once.
        for key in list(self._losses):
            parked = self._getters.get(key)
            if parked:
                getter = parked.popleft()
                if getter.handle is not None:
                    self._deadlines.cancel(getter.handle)
                self._requeue_front(getter.items)
                self._raise_loss(getter)
