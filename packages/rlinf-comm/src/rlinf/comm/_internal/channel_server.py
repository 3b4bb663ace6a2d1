"""The owner of a channel: a queue of item *descriptors*, never of payloads.

A `ChannelServer` runs as threads in the process that created the channel and listens on its
own authenticated port (published in the store). Producers send descriptors (where the
payload lies: a shared-memory segment, the producer's endpoint); consumers receive them and
open the payload themselves. The server also routes release acknowledgements from consumers
back to the producer that owns the payload, and cleans up after clients that die:

- a consumer dies: the payloads it took but never released are released to their producers;
- a producer dies: its queued items are dropped (their payloads died with it) and the next
  `get` on each affected key raises PeerDiedError naming the producer;
- the last client that put, or could (it never asked for items), dies without saying
  ``bye`` (a crash, not `Channel.disconnect`): a get with nothing to take raises
  PeerDiedError at once, once per consumer, instead of waiting out its timeout for items
  never sent (a newcomer's hello or a put ends that state).

Ordering is FIFO per key. Back-pressure: `maxsize` bounds the number of items queued over
all keys (0: unbounded); a put that does not fit waits (FIFO) until consumers make room.
Every parked request carries a deadline that the server enforces, so a timed-out put was
never enqueued and a timed-out get took nothing: nothing is lost or duplicated.

*Credits* spare producers a round trip per put. A client that says ``credit`` in its hello
may ask a put's reply to reserve room for later items (``want``); the reply's ``grant`` is
what the owner set aside for it, which it then spends with one-way ``cput`` messages that
the owner admits unconditionally (the room is theirs, even after a close: they were sent
before the client learnt of it). On an unbounded channel a ``credit`` client sends every
put as a ``cput``. Room is granted only while no put waits for room, and once one does the
owner asks every holder to give its unspent credits back (``revoke``); a holder answers
with ``return`` on the same connection, after the cputs it sent before, so nothing is
counted twice. A client's credits die with it. ``closed`` tells credit clients that the
channel was closed.

A credit client on this node also offers a *put ring* (``put_ring``, see `put_ring`) at its
first small put: its small inline puts then go through shared memory, not its connection,
as cputs in order with its frames; the owner drains the rings before it handles any frame,
local get or stat, and asks for a ``ring`` doorbell frame only while a get is parked.

A credit client on this node also offers a *credit word* (`credit.CreditWord`) when it first
waits for room (``credit_word``): the owner then grants it room by adding to that shared
word, with no message, and keeps it topped up (to an equal share of ``maxsize``, a slot at
a time) whenever room frees or items it sent on credit arrive, and grants what there is
when it says ``want`` (it found no room for a while: the owner then also asks the other
holders to give theirs back). Its puts answer with ``grant`` 0: the word carries the grants.

Small payloads travel *inline*: an item whose descriptor is ``{"t": "inline", ...}`` brings
its bytes as ``nb`` raw buffers of the put's frame, which the owner keeps (zero-copy views of
the frame) and sends on with the get's reply. Nothing is left in the producer for them: they
need no release, and they survive their producer's death.

Protocol (JSON headers, requests carry `id`, replies `re`; items' buffers follow the frame's
header in item order):
  hello {endpoint}                          -> {maxsize}
  put {key, items: [{w, p, nb?}], timeout}  -> {accepted, timed_out?}
  get {key, target_weight|null, timeout}    -> {items: [{uid, w, p, pr?, nb?}], producers}
  release {uids}                            (one way; forwarded as release {xids} to producers)
  unget {items: [{uid} | {uid, key, w, p, nb}]}
                                            (one way: items a get that gave up was handed
                                             late go back to the head of their queues; inline
                                             ones bring their bytes back)
  close {} -> {};  stat {key|null} -> {qsize, weight, closed, maxsize};  whoami {} -> {name}
  sync {} -> {}                             (every earlier message of the client was handled)
  bye {}                                    (one way: a clean disconnect follows)
Credits (clients whose hello says ``credit: true``):
  hello {..., credit}                       -> {maxsize}
  credit_word {offer}                       -> {mapped}  (then grants go into the word)
  put {..., want}                           -> {accepted, timed_out?, grant}
  cput {key, items: [{w, p, nb?}]}          (one way, spends credits)
  return {n}                                (one way, answers revoke)
  want {}                                   (one way: a credit-word client found no room)
  put_ring {offer}                          -> {mapped}  (then small cputs go in the ring)
  ring {}                                   (one way: the doorbell, see `put_ring`)
  owner pushes: revoke {}, closed {}
"""

from __future__ import annotations

import itertools
import threading
import time
from collections import deque
from dataclasses import dataclass, field
from typing import Any

from rlinf.comm import errors
from rlinf.comm._internal.credit import CreditWord
from rlinf.comm._internal.endpoint_layout import INLINE
from rlinf.comm._internal.local_rpc import LocalPeer
from rlinf.comm._internal.logs import get_logger
from rlinf.comm._internal.put_ring import RingItem, RingReader
from rlinf.comm._internal.rpc import Buffers, Deadlines, Header, RpcPeer, RpcServer
from rlinf.comm._internal.store import check_timeout

log = get_logger(__name__)

DEFAULT_KEY = "default"

_in_process: dict[tuple[str, int], ChannelServer] = {}
"""Servers running in this process, by address: handles made here talk to them directly."""
_in_process_lock = threading.Lock()


@dataclass(eq=False, slots=True)
class _Item:
    uid: int
    key: str
    weight: float
    payload: Any  # the producer's descriptor (JSON), opaque to the server
    producer: Any  # the producer's peer (an `RpcPeer`)
    buffers: Buffers = field(default_factory=list)  # an inline payload's bytes

    @property
    def inline(self) -> bool:
        """Whether the payload lives here (inline) rather than with its producer."""
        return isinstance(self.payload, dict) and self.payload.get("t") == INLINE

    def wire(self, producers: dict[Any, int]) -> Header:
        """The item as a consumer sees it; `producers` numbers the producers of a reply
        (each producer's endpoint info is sent once per reply, not once per item; inline
        items need none)."""
        if self.inline:
            return {"uid": self.uid, "w": self.weight, "p": self.payload,
                    "nb": len(self.buffers)}
        index = producers.setdefault(self.producer, len(producers))
        return {"uid": self.uid, "w": self.weight, "p": self.payload, "pr": index}

    def local_view(self) -> Header:
        """The item as a consumer in the owner's process sees it (`wire`, resolved)."""
        if self.inline:
            return {"uid": self.uid, "w": self.weight, "p": self.payload}
        return {"uid": self.uid, "w": self.weight, "p": self.payload,
                "producer": self.producer.info.get("endpoint")}


class LocalOutcome:
    """What a local get comes to: its items or its error, settled under the server's lock.

    Not a `Future`: the getter's own thread waits by reading the producers' connections
    (and a wake pipe), never on a condition, so a future's lock, condition and callbacks
    were only cost. It holds no reference back to its getter: a cycle between them made
    every local get garbage that only the cyclic collector frees.
    """

    __slots__ = ("_error", "_items")

    def __init__(self) -> None:
        self._items: list[_Item] | None = None
        self._error: BaseException | None = None

    def done(self) -> bool:
        return self._items is not None or self._error is not None

    def set_result(self, items: list[_Item]) -> None:
        self._items = items

    def set_exception(self, error: BaseException) -> None:
        self._error = error

    def result(self) -> list[_Item]:
        """The items; raises the get's error; AssertionError while it is not settled."""
        if self._error is not None:
            raise self._error
        assert self._items is not None, "a local get's outcome was read before it settled"
        return self._items


@dataclass(eq=False)
class _Getter:
    peer: Any  # an `RpcPeer`, or a `LocalPeer`'s server side
    request: Header
    key: str
    target: float | None  # None: exactly one item
    items: list[_Item] = field(default_factory=list)
    weight: float = 0.0
    handle: int | None = None
    outcome: LocalOutcome | None = None  # a local get's: the items themselves

    def satisfied(self) -> bool:
        if self.target is None:
            return len(self.items) == 1
        return self.weight >= self.target

    def fail(self, exc: errors.CommError) -> None:
        if self.outcome is not None:
            if not self.outcome.done():
                self.outcome.set_exception(exc)
                self.peer.wake()
        else:
            self.peer.reply_error(self.request, exc)


@dataclass(eq=False)
class _Putter:
    peer: RpcPeer
    request: Header
    key: str
    pending: deque[tuple[float, Any, Buffers]]
    accepted: int = 0
    handle: int | None = None


@dataclass(eq=False)
class _Client:
    delivered: dict[int, _Item] = field(default_factory=dict)
    dead: bool = False
    credit: bool = False  # speaks the credit protocol (its hello said so)
    credits: int = 0  # room reserved for its cputs
    revoking: bool = False  # asked to give its credits back, no answer yet
    word: CreditWord | None = None  # where its grants go (a client on this node)
    wants: bool = False  # said `want` and got nothing since
    active: bool = False  # has put (a consumer's handle never gets a share of room)
    puts: int = 0  # put and cput requests it sent
    gets: bool = False  # has asked for items (a consumer)
    told_orphaned: bool = False  # its get learnt that no producer is left
    ring: RingReader | None = None  # its put ring (a producer on this node)
    # Frames of its connection handled (with a ring: what its slots wait for). A client
    # sends only requests and notices, all handled by `_handle`, never replies.
    handled: int = 0
    left_cleanly: bool = False  # said bye before its connection closed (not a crash)

    @property
    def may_produce(self) -> bool:
        """It put, or it never asked for items: it may put (more)."""
        return bool(self.puts) or not self.gets


class ChannelServer:
    """Serves one named channel; see the module docstring for the semantics."""

    def __init__(self, name: str, *, token: bytes, maxsize: int = 0, host: str = "127.0.0.1"):
        if maxsize < 0:
            raise ValueError(f"expected maxsize >= 0 (0: unbounded); got {maxsize}")
        self.name = name
        self.maxsize = maxsize
        self._queues: dict[str, deque[_Item]] = {}
        self._count = 0
        self._granted = 0  # credits held by clients, over all of them
        self._sharers = 0  # live credit-word clients that have put: they share the room
        self._getters: dict[str, deque[_Getter]] = {}
        self._putters: deque[_Putter] = deque()
        self._clients: dict[RpcPeer, _Client] = {}
        self._losses: dict[str, list[str]] = {}  # key -> why its items were lost
        self._orphaned: str | None = None  # set while no client that put, or may, is left
        self._last_left: str | None = None  # the last client that put, or may have, and left
        self._closed = False
        self._uids = itertools.count(1)
        self._lock = threading.RLock()
        self._deadlines = Deadlines(name=f"channel-{name}")
        self._server = RpcServer(
            name=f"channel-{name}", token=token, host=host,
            on_message=self._handle, on_close=self._client_died,
        )
        self._local_peers: set[LocalPeer] = set()
        self._rings: dict[RpcPeer, _Client] = {}  # clients with a put ring
        self._doorbells = False  # whether the rings ask for a doorbell (a get is parked)
        with _in_process_lock:
            _in_process[self.address] = self

    @property
    def address(self) -> tuple[str, int]:
        return self._server.address

    @staticmethod
    def in_process(address: tuple[str, int]) -> ChannelServer | None:
        """The server at `address` if it runs in this process (and still serves)."""
        with _in_process_lock:
            return _in_process.get((str(address[0]), int(address[1])))

    def local_peer(self, *, name: str, on_message: Any = None, on_close: Any = None
                   ) -> LocalPeer:
        """A client connection from this process: the handler runs in the caller's thread."""
        peer = LocalPeer(self._handle, name=name, on_message=on_message, on_close=on_close,
                         server_closed=self._client_died, direct_read=self._read_direct)
        with self._lock:
            self._local_peers.add(peer)
        return peer

    def _read_direct(self, done: Any, deadline: float, wake_fd: int) -> None:
        """A local handle waits for an answer (a get for a producer's put): it reads the
        producers' connections itself, no thread hands the frame over."""
        self._server.read_direct(done, deadline=deadline, wake_fd=wake_fd)

    def shutdown(self) -> None:
        """Stop serving; connected clients see PeerDiedError."""
        with _in_process_lock:
            if _in_process.get(self.address) is self:
                del _in_process[self.address]
        self._server.close()
        with self._lock:
            local, self._local_peers = list(self._local_peers), set()
            parked = [g for waiting in self._getters.values() for g in waiting if g.outcome]
            for client in self._rings.values():
                if client.ring is not None:
                    client.ring.close()
                    client.ring = None
            self._rings.clear()
        gone = errors.PeerDiedError(f"channel {self.name!r} stopped")
        for getter in parked:
            getter.fail(gone)
        for peer in local:
            peer.server_gone()
        self._deadlines.close()

    # -- dispatch ---------------------------------------------------------------------
    def _handle(self, peer: RpcPeer, header: Header, buffers: Buffers) -> None:
        op = header.get("op")
        with self._lock:
            client = self._clients.get(peer)
            if client is None:
                client = self._clients[peer] = _Client()
            if self._rings:  # what was written before this frame comes first
                self._drain_rings()
            if op == "cput":
                self._produced_by(client)
                self._cput(peer, client, header, buffers)
            elif op == "put":
                self._produced_by(client)
                self._put(peer, header, buffers)
            elif op == "get":
                self._consumed_by(client)
                self._get_request(peer, header)
            elif op == "release":
                self._release(client, [int(u) for u in header["uids"]])
            elif op == "unget":
                self._unget(peer, client, header, buffers)
            elif op == "return":
                self._return(client, int(header.get("n", 0)))
            elif op == "want":
                self._want(peer, client)
            elif op == "sync":
                peer.reply(header, {})
            elif op == "bye":
                client.left_cleanly = True
            elif op == "hello":
                self._producer_may_come()  # a newcomer may put
                peer.info = dict(header)
                peer.name = f"{self.name}<-{header.get('endpoint', {}).get('name', '?')}"
                client.credit = bool(header.get("credit"))
                peer.reply(header, {"maxsize": self.maxsize})
            elif op == "credit_word":
                self._credit_word(peer, client, header)
            elif op == "whoami":  # a newcomer asking for our name checks we are alive
                peer.reply(header, {"name": self.name})
            elif op == "stat":
                peer.reply(header, self._stat(header.get("key")))
            elif op == "close":
                self._close()
                peer.reply(header, {})
            elif op == "ring":
                pass  # drained above
            elif op == "put_ring":
                self._attach_ring(peer, client, header)
            else:
                peer.reply_error(header, errors.CommError(f"expected a channel op; got {op!r}"))
            if client.ring is not None:  # slots written after this frame may go now
                client.handled = peer.conn.frames_received
                self._drain_ring(peer, client)

    def _stat(self, key: str | None) -> Header:
        if key is None:
            qsize = self._count
            weight = sum(i.weight for q in self._queues.values() for i in q)
        else:
            queue = self._queues.get(key, deque())
            qsize, weight = len(queue), sum(i.weight for i in queue)
        return {"qsize": qsize, "weight": weight, "closed": self._closed, "maxsize": self.maxsize}

    # -- put --------------------------------------------------------------------------
    def _put(self, peer: RpcPeer, request: Header, buffers: Buffers) -> None:
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
        try:
            pending = deque(_split_items(request["items"], buffers))
        except errors.CodecError as exc:
            peer.reply_error(request, exc)
            return
        putter = _Putter(peer, request, key, pending)
        self._admit(putter)
        if putter.pending:
            self._putters.append(putter)
            putter.handle = self._deadlines.schedule(
                time.monotonic() + timeout, lambda: self._expire_put(putter)
            )
            self._revoke()
        else:
            self._accept(putter)

    def _accept(self, putter: _Putter) -> None:
        """Answer a put whose items all went in, with the room it may reserve ahead."""
        grant = 0
        client = self._clients.get(putter.peer)
        want = putter.request.get("want")
        if client is not None and client.word is not None:
            self._activate(client)
            self._topup(client)  # the word carries it
        elif (client is not None and client.credit and self.maxsize > 0 and not self._putters
                and not self._closed and isinstance(want, int) and want > 0):
            grant = max(0, min(want, self.maxsize - self._count - self._granted))
            client.credits += grant
            self._granted += grant
        putter.peer.reply(putter.request, {"accepted": putter.accepted, "grant": grant})

    def _topup(self, client: _Client) -> None:
        """Grant a credit-word client room up to its share of `maxsize`, if there is room
        and no put waits for it."""
        if client.word is None or not client.active or client.dead or self._putters or (
                self._closed):
            return
        share = max(1, self.maxsize // max(1, self._sharers))
        give = min(self.maxsize - self._count - self._granted, share - client.credits)
        # Every freed slot at once: a busy producer finds it without a system call (the
        # word wakes only a sleeping one), and one that waited half a share for its wake-up
        # left the consumer idle meanwhile.
        if give > 0:
            client.credits += give
            self._granted += give
            client.wants = False
            client.word.add(give)

    def _activate(self, client: _Client) -> None:
        """A credit-word client put or asked: from now on it has a share of the room."""
        if not client.active:
            client.active = True
            self._sharers += client.word is not None

    def _topup_all(self) -> None:
        """Room freed: credit-word clients that asked for room first, then the others."""
        if not self._granted < self.maxsize - self._count:
            return
        clients = [c for c in self._clients.values() if c.word is not None and c.active]
        if len(clients) > 1:
            clients.sort(key=lambda c: not c.wants)
        for client in clients:
            self._topup(client)

    def _credit_word(self, peer: RpcPeer, client: _Client, request: Header) -> None:
        """A credit client on this node offers a word for its grants: map it, and grant it
        room at once (it asks because a put of its waits)."""
        if client.credit and self.maxsize > 0 and client.word is None and not client.dead:
            client.word = CreditWord.attach(request.get("offer"))
        if client.word is not None:  # granted before the answer: it finds room at once
            self._activate(client)
            client.wants = True
            self._topup(client)
        peer.reply(request, {"mapped": client.word is not None})

    def _want(self, peer: RpcPeer, client: _Client) -> None:
        """A credit-word client waited for room in vain: grant it some now, or have the
        others give theirs back."""
        client.wants = True
        self._activate(client)
        self._topup(client)
        if client.wants:
            self._revoke(sparing=client)

    def _cput(self, peer: RpcPeer, client: _Client, request: Header, buffers: Buffers) -> None:
        """Items sent on credit: their room was reserved, so they go in whatever the state."""
        try:
            items = _split_items(request["items"], buffers)
        except errors.CodecError as exc:
            log.warning("channel_bad_cput", channel=self.name, client=peer.name, error=str(exc))
            return
        self._spend(peer, client, len(items))
        key = str(request.get("key") or DEFAULT_KEY)
        for weight, payload, bufs in items:
            self._offer(_Item(next(self._uids), key, weight, payload, peer, bufs))
        self._replace_spent(client)

    def _spend(self, peer: RpcPeer, client: _Client, n: int) -> None:
        """`n` items arrived on credit: the room they had reserved is now theirs."""
        if self.maxsize > 0:
            spent = min(n, client.credits)
            if spent < n:
                log.warning("channel_cput_without_credit", channel=self.name,
                            client=peer.name, items=n, credits=client.credits)
            client.credits -= spent
            self._granted -= spent

    def _replace_spent(self, client: _Client) -> None:
        if client.word is not None:  # replace what it spent, room permitting
            self._activate(client)
            self._topup(client)

    # -- put rings (see `put_ring`) -------------------------------------------------------
    def _attach_ring(self, peer: RpcPeer, client: _Client, request: Header) -> None:
        if client.ring is None and client.credit and not client.dead:
            client.ring = RingReader.attach(request.get("offer"))
            if client.ring is not None:
                self._rings[peer] = client
                client.handled = peer.conn.frames_received
                client.ring.ask_doorbell(self._doorbells)
        peer.reply(request, {"mapped": client.ring is not None})

    def _drain_rings(self) -> None:
        """Take what the producers on this node wrote into their rings (under the lock);
        stop asking for doorbells once no get is parked."""
        for peer, client in list(self._rings.items()):
            self._drain_ring(peer, client)
        if self._doorbells and not any(self._getters.values()):
            self._ask_doorbells(False)

    def _drain_ring(self, peer: RpcPeer, client: _Client) -> None:
        ring = client.ring
        if ring is None or not ring.has_items():
            return
        try:
            items = ring.take(client.handled)
        except errors.CodecError as exc:
            log.warning("channel_bad_ring", channel=self.name, client=peer.name, error=str(exc))
            self._detach_ring(peer, client)
            return
        if items:
            self._take_ring_items(peer, client, items)

    def _take_ring_items(self, peer: RpcPeer, client: _Client, items: list[RingItem]) -> None:
        self._produced_by(client)
        self._spend(peer, client, len(items))
        for item in items:
            self._offer(_Item(next(self._uids), item.key, item.weight,
                              {"t": INLINE, "d": item.descriptor}, peer, item.buffers))
        self._replace_spent(client)

    def _ask_doorbells(self, on: bool) -> None:
        """Have producers ring after their puts (`on`: a get is parked) or stop. Turning
        them on, each ring is looked at once more (see `ring` on why nothing is missed)."""
        self._doorbells = on
        for client in self._rings.values():
            if client.ring is not None:
                client.ring.ask_doorbell(on)
        if on:
            for peer, client in list(self._rings.items()):
                self._drain_ring(peer, client)
            if not any(self._getters.values()):  # what it found served the parked gets
                self._ask_doorbells(False)

    def _detach_ring(self, peer: RpcPeer, client: _Client) -> None:
        if client.ring is not None:
            client.ring.close()
            client.ring = None
        self._rings.pop(peer, None)

    def _revoke(self, *, sparing: _Client | None = None) -> None:
        """A put waits for room while clients hold credits: ask them to give those back."""
        if not self._granted:
            return
        for peer, client in self._clients.items():
            if client is sparing:
                continue
            if client.credits and not client.revoking and not client.dead:
                client.revoking = True
                try:
                    peer.notify({"op": "revoke"})
                except errors.CommError:
                    log.debug("revoke_to_dead_client", channel=self.name, client=peer.name)

    def _return(self, client: _Client, n: int) -> None:
        """A client gave back `n` unspent credits (its answer to `revoke`)."""
        n = max(0, min(n, client.credits))
        client.credits -= n
        self._granted -= n
        client.revoking = False
        self._make_room()

    def _has_room(self) -> bool:
        return self.maxsize == 0 or self._count + self._granted < self.maxsize

    def _admit(self, putter: _Putter) -> None:
        while putter.pending and self._has_room():
            weight, payload, buffers = putter.pending.popleft()
            item = _Item(next(self._uids), putter.key, weight, payload, putter.peer, buffers)
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
        """After items left the queue: let parked puts in, in arrival order, then grant
        credit words what is left."""
        while self._putters and self._has_room():
            putter = self._putters[0]
            self._admit(putter)
            if putter.pending:
                return
            self._putters.popleft()
            if putter.handle is not None:
                self._deadlines.cancel(putter.handle)
            self._accept(putter)
        if self.maxsize > 0 and not self._putters:
            self._topup_all()

    # -- get --------------------------------------------------------------------------
    def _get_request(self, peer: RpcPeer, request: Header) -> None:
        key = str(request.get("key") or DEFAULT_KEY)
        try:
            timeout = check_timeout(request.get("timeout"))
        except errors.InvalidArgumentError as exc:
            peer.reply_error(request, exc)
            return
        target = request.get("target_weight")
        self._get(_Getter(peer, request, key, None if target is None else float(target)),
                  timeout)

    def get_local(self, peer: LocalPeer, *, key: str, target: float | None,
                  timeout: float) -> _Getter:
        """A get for a handle in this process: the getter's `outcome`
        settles with the items themselves (nothing is encoded), or with the error a remote
        get would raise. The caller's thread enforces `timeout` itself (`expire_local` once
        it passed): no timer is set."""
        getter = _Getter(peer.remote, {}, key, target, outcome=LocalOutcome())
        with self._lock:
            client = self._clients.get(peer.remote)  # type: ignore[call-overload]
            if client is None:
                client = self._clients[peer.remote] = _Client()  # type: ignore[index]
            if self._rings:
                self._drain_rings()
            self._consumed_by(client)
            self._get(getter, timeout)
        return getter

    def take_local(self, peer: LocalPeer, key: str) -> _Item | None:
        """The oldest item under `key` for a local get of one item, when one is queued, no
        other getter waits for it and no loss is to be reported on the key (a consumer
        behind its producers: the usual case of a stream). No getter and no outcome are
        made. None: nothing to take at once; the caller goes through `get_local`."""
        with self._lock:
            if self._rings:
                self._drain_rings()
            client = self._clients.get(peer.remote)  # type: ignore[call-overload]
            queue = self._queues.get(key)
            if (client is None or client.dead or not client.gets or not queue
                    or self._getters.get(key) or key in self._losses):
                return None
            item = queue.popleft()
            self._count -= 1
            if not item.inline:  # released later, through this client
                client.delivered[item.uid] = item
            self._make_room()
            return item

    def expire_local(self, getter: _Getter, timeout: float) -> None:
        """A local get's time ran out: unless it was served meanwhile, its reserved items
        go back and its outcome fails with CommTimeoutError (settled under the lock:
        nothing is lost or handed out twice)."""
        self._expire_get(getter, timeout)

    def _get(self, getter: _Getter, timeout: float) -> None:
        key = getter.key
        if self._raise_loss(getter) or (not self._queues.get(key) and self._tell_orphaned(getter)):
            return
        queue = self._queues.get(key)
        waiting = self._getters.get(key)
        # Getters already waiting on this key go first (FIFO among consumers).
        while queue and not waiting and not getter.satisfied():
            item = queue.popleft()
            self._count -= 1
            getter.items.append(item)
            getter.weight += item.weight
        took = bool(getter.items)
        if getter.satisfied() or (self._closed and getter.items):
            self._deliver(getter)
        elif self._closed:
            getter.fail(self._closed_error(key))
        else:
            self._getters.setdefault(key, deque()).append(getter)
            if getter.outcome is None:  # a local caller expires its own get
                getter.handle = self._deadlines.schedule(
                    time.monotonic() + timeout, lambda: self._expire_get(getter, timeout)
                )
            if not self._doorbells:  # it sleeps: producers with a ring must ring
                self._ask_doorbells(True)
        if took:
            # Only now: the puts let in go to this getter if it waits, in order (before,
            # they were queued behind its back while later items went to it directly).
            self._make_room()

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
        if getter.outcome is not None:  # a local get: the items themselves
            for item in getter.items:
                if not item.inline:
                    client.delivered[item.uid] = item
            if not getter.outcome.done():
                getter.outcome.set_result(getter.items)
                getter.peer.wake()  # its thread may be reading other connections
            return
        buffers: Buffers = []
        for item in getter.items:
            if item.inline:  # the bytes go along: nothing to release later
                buffers.extend(item.buffers)
            else:
                client.delivered[item.uid] = item
        producers: dict[Any, int] = {}
        items = [i.wire(producers) for i in getter.items]
        infos = [p.info.get("endpoint") for p in producers]  # dicts keep insertion order
        getter.peer.reply(getter.request, {"items": items, "producers": infos}, buffers)

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
        getter.fail(errors.CommTimeoutError(
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
        if (client := self._clients.get(getter.peer)) is not None:
            client.told_orphaned = True  # it hears of the producer's death here
        getter.fail(errors.PeerDiedError(
            f"expected items under key {getter.key!r} of channel {self.name!r}; "
            + "; ".join(lost)
        ))
        return True

    def _produced_by(self, client: _Client) -> None:
        client.puts += 1
        if self._orphaned is not None:
            self._producer_may_come()

    def _producer_may_come(self) -> None:
        if self._orphaned is not None:
            self._orphaned = None
            for other in self._clients.values():
                other.told_orphaned = False

    def _tell_orphaned(self, getter: _Getter) -> bool:
        """Fail `getter` (nothing queued for it) when every client that put, or could, is
        gone — at most once per consumer: what it waits for was never sent and cannot come
        unless a producer connects again."""
        client = self._clients.get(getter.peer)
        if self._orphaned is None or client is None or client.told_orphaned:
            return False
        client.told_orphaned = True
        getter.fail(errors.PeerDiedError(
            f"expected an item under key {getter.key!r} of channel {self.name!r}; none is "
            f"queued and no producer is left ({self._orphaned}): an item it never sent will "
            "not come unless a producer connects again"))
        return True

    def _consumed_by(self, client: _Client) -> None:
        if not client.gets:
            client.gets = True
            self._check_orphaned()

    def _check_orphaned(self) -> None:
        """Whether every client that put, or could, is gone (one left, none remains)."""
        if self._last_left is not None and self._orphaned is None and \
                not any(c.may_produce for c in self._clients.values()):
            self._orphaned = self._last_left

    def _orphan_waiting(self, who: str, client: _Client) -> None:
        """`client` (`who`) crashed (it left without saying bye): when it was the last that
        put or could, parked gets with nothing gathered learn it now, and later gets on
        empty keys at once. A producer that leaves cleanly orphans nobody: others may
        still connect and put (producers that start one after another)."""
        if not client.may_produce or client.left_cleanly:
            return
        self._last_left = (f"{who!r}, the last, left after {client.puts} put request(s)"
                           if client.puts else f"{who!r}, the last, left without putting")
        self._check_orphaned()
        if self._orphaned is None:
            return
        for waiting in self._getters.values():
            for getter in [g for g in waiting if not g.items]:
                owner = self._clients.get(getter.peer)
                if owner is None or owner.told_orphaned:
                    continue
                waiting.remove(getter)
                if getter.handle is not None:
                    self._deadlines.cancel(getter.handle)
                self._tell_orphaned(getter)

    # -- release, close, client death ---------------------------------------------------
    def _release(self, client: _Client, uids: list[int]) -> None:
        by_producer: dict[RpcPeer, list[Any]] = {}
        for uid in uids:
            item = client.delivered.pop(uid, None)
            if item is not None and not item.inline:
                by_producer.setdefault(item.producer, []).append(item.payload.get("xid"))
        for producer, xids in by_producer.items():
            if producer.closed:
                continue
            try:
                producer.notify({"op": "release", "xids": xids})
            except errors.CommError:
                log.debug("release_to_dead_producer", channel=self.name, producer=producer.name)

    def _unget(self, peer: RpcPeer, client: _Client, request: Header, buffers: Buffers) -> None:
        """Items delivered to a get whose caller had given up (its owner answered after the
        caller's deadline) go back, in order, to the head of their queues. Inline items
        come back with their bytes; the others are found among the client's deliveries."""
        entries = request.get("items")
        if entries is None:  # the uid-only form
            entries = [{"uid": u} for u in request.get("uids", ())]
        items = []
        at = 0
        for entry in entries:
            if "p" in entry:
                nb = int(entry.get("nb", 0))
                items.append(_Item(int(entry["uid"]), str(entry["key"]), float(entry["w"]),
                                   entry["p"], peer, buffers[at:at + nb]))
                at += nb
            elif (item := client.delivered.pop(int(entry["uid"]), None)) is not None:
                items.append(item)
        self._requeue_front(items)
        for key in {item.key for item in items}:
            self._serve_waiting(key)

    def _close(self) -> None:
        if self._closed:
            return
        self._closed = True
        log.debug("channel_closed", channel=self.name)
        for peer, client in self._clients.items():  # their next put fails without asking
            if client.credit and not client.dead:
                try:
                    peer.notify({"op": "closed"})
                except errors.CommError:
                    log.debug("closed_to_dead_client", channel=self.name, client=peer.name)
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
                    getter.fail(self._closed_error(key))
            waiting.clear()

    def _client_died(self, peer: RpcPeer, exc: BaseException) -> None:
        with self._lock:
            client = self._clients.get(peer)
            if client is None:
                return
            if client.ring is not None:  # what it wrote before it went is still good
                client.handled = peer.conn.frames_received
                self._drain_ring(peer, client)
                self._detach_ring(peer, client)
            del self._clients[peer]
            client.dead = True
            self._granted -= client.credits  # room it held goes back
            client.credits = 0
            if client.word is not None:
                self._sharers -= client.active
                client.word.close()
                client.word = None
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
                    if getter.outcome is not None:  # a local handle closed under its get
                        getter.fail(errors.PeerDiedError(f"{peer.name} was closed locally"))
                self._serve_waiting(key)
            self._drop_items_of(peer, who)
            self._orphan_waiting(who, client)
            self._make_room()
        log.debug("channel_client_gone", channel=self.name, client=who, reason=str(exc))

    def _drop_items_of(self, producer: RpcPeer, who: str) -> None:
        """A dead producer's queued items cannot be opened any more: drop and report them.
        (Inline items live here, not with their producer: they stay.)"""
        for key, queue in self._queues.items():
            kept = deque(i for i in queue if i.producer is not producer or i.inline)
            lost = len(queue) - len(kept)
            if lost:
                self._queues[key] = kept
                self._count -= lost
                self._losses.setdefault(key, []).append(
                    f"producer {who!r} died and {lost} of its queued items were lost"
                )
        for key, waiting in self._getters.items():
            for getter in list(waiting):
                mine = [i for i in getter.items if i.producer is producer and not i.inline]
                if not mine:
                    continue
                waiting.remove(getter)
                if getter.handle is not None:
                    self._deadlines.cancel(getter.handle)
                self._requeue_front([i for i in getter.items if i not in mine])
                getter.fail(errors.PeerDiedError(
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


def _split_items(items: Any, buffers: Buffers) -> list[tuple[float, Any, Buffers]]:
    """A put's items as (weight, descriptor, inline buffers), the frame's buffers dealt out
    in item order (``nb`` each); CodecError when the counts do not add up."""
    out = []
    at = 0
    for item in items:
        nb = int(item.get("nb", 0))
        if nb < 0 or at + nb > len(buffers):
            raise errors.CodecError(f"expected {nb} buffers for an item after {at}; the put "
                                    f"carries {len(buffers)} in all")
        out.append((float(item["w"]), item["p"], buffers[at:at + nb]))
        at += nb
    if at != len(buffers):
        raise errors.CodecError(f"expected {at} buffers for the put's items; got {len(buffers)}")
    return out
