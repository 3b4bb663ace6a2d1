"""`Endpoint`: this process's address in rlinf.comm, and point-to-point send/recv.

One endpoint per process: a name, a `Locality` (node, process), an authenticated listener,
cached connections to peers (looked up by name in a `Store`), and the table of payloads this
process exported and others have not released yet.

`send(batch, dst)` picks a transport from the two localities and the data's device (shared
memory on one node, TCP across nodes, CUDA IPC / NCCL for GPU data; overridable per call),
exports the batch and sends the descriptor (plus the bytes, for transports that carry
them) on the connection to `dst`. The receiver opens it zero-copy; when the received arrays
die, a release acknowledgement flows back and the sender's transport reuses the segment.
A peer that dies surfaces as PeerDiedError naming it; every wait has a timeout.
"""

from __future__ import annotations

import itertools
import json
import os
import queue
import socket
import threading
import time
import uuid
from collections import deque
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from concurrent.futures import wait as wait_all
from dataclasses import dataclass, field, replace
from typing import ClassVar

from rlinf.comm import errors
from rlinf.comm._internal import codec, names, shm, wire
from rlinf.comm._internal import endpoint_layout as layout
from rlinf.comm._internal import transports as tp
from rlinf.comm._internal.locality import default_listen_host, process_stamp
from rlinf.comm._internal.logs import get_logger
from rlinf.comm._internal.rpc import (
    Buffers,
    Deadlines,
    Header,
    Notifier,
    RpcPeer,
    RpcServer,
    wait_future,
)
from rlinf.comm._internal.store import Store, check_timeout
from rlinf.comm._internal.work import Work
from rlinf.comm.batch import Array, Batch

log = get_logger(__name__)


@dataclass(frozen=True)
class EndpointConfig:
    """Options of an `Endpoint`."""

    host: str = ""
    """Interface to listen on; another node must be able to reach it. Empty: env
    RLINF_COMM_HOST, else this node's IP when the process is connected to Ray, else
    127.0.0.1 (see `locality.default_listen_host`)."""
    timeout: float = 300.0
    """Seconds a blocking call waits when the caller passes `timeout=None`."""
    connect_timeout: float = 30.0
    """Seconds to establish (and authenticate) a connection to a peer."""
    eager_bytes: int = 64 * 1024
    """Host payloads up to this size travel inline (TCP frame) instead of in shared memory."""
    pack_bytes: int = 64 * 1024
    """Channel payloads up to this size put together (`put_many`) share one segment."""
    arena_bytes: int = 1 << 20
    """Size of the segments that small channel payloads are packed into."""
    pool_free_bytes: int | None = None
    """Keep at least this many bytes of released segments warm for reuse (None: the pool's
    default). Raise it when several large payloads are in flight at once: a segment the
    pool evicts is created again cold (page faults on both sides)."""
    close_timeout: float = 30.0
    """Seconds `close()` waits (when the caller passes `timeout=None`) for pending `isend`s
    and for every live peer this endpoint sent to to confirm it took those messages in."""


def _store_key(name: str) -> str:
    return f"rlinf/comm/endpoint/{name}"


def _alive(pid: int) -> bool:
    """Whether process `pid` of this node still exists."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


@dataclass(eq=False)
class _Arena:
    """A pooled segment shared by several small payloads; back to the pool when all die."""

    segment: str
    live: int


@dataclass(eq=False)
class _Export:
    transport: tp.Transport
    exported: tp.Exported
    peer: str | None  # endpoint it was sent to (p2p), None for channel payloads
    arena: _Arena | None = None


@dataclass(eq=False)
class _Waiter:
    future: Future[Batch]
    deadline: int = -1  # handle in the endpoint's Deadlines


@dataclass(eq=False, slots=True)
class _Message:
    """A received frame, opened when a receive takes it (or earlier, see `_take_in`)."""

    header: Header
    buffers: Buffers
    peer: RpcPeer
    opened: Batch | BaseException | None = None


@dataclass(eq=False)
class _Inbox:
    """Messages from one source, and the receives waiting for them (both FIFO)."""

    messages: deque[_Message] = field(default_factory=deque)
    waiters: deque[_Waiter] = field(default_factory=deque)
    dead: str | None = None


class _Releaser:
    """Sends release acknowledgements from a background thread, batched per peer.

    `post` may be called from anywhere, including garbage-collector callbacks that run
    while this thread or another holds a connection's lock: it only appends to a
    SimpleQueue (reentrant), never touches a socket.
    """

    def __init__(self) -> None:
        self._queue: queue.SimpleQueue[tuple[Notifier, str, int] | None] = queue.SimpleQueue()
        self._thread = threading.Thread(target=self._run, name="rlinf-releaser", daemon=True)
        self._thread.start()

    def post(self, peer: Notifier, field_name: str, ident: int) -> None:
        self._queue.put((peer, field_name, ident))

    def close(self) -> None:
        self._queue.put(None)

    def _run(self) -> None:
        while True:
            first = self._queue.get()
            if first is None:
                return
            entries = [first]
            closing = False
            while True:  # drain what piled up: one message per peer, not per release
                try:
                    entry = self._queue.get_nowait()
                except queue.Empty:
                    break
                if entry is None:
                    closing = True
                    break
                entries.append(entry)
            grouped: dict[tuple[Notifier, str], list[int]] = {}
            for peer, name, ident in entries:
                grouped.setdefault((peer, name), []).append(ident)
            for (peer, name), idents in grouped.items():
                if peer.closed:
                    continue
                try:
                    peer.notify({"op": "release", name: idents})
                except errors.CommError:
                    log.debug("release_dropped", peer=peer.name, count=len(idents))
            if closing:
                return


class Endpoint:
    """This process's communication endpoint (create one per process).

    Registers `name` in `store`; peers address it by that name. The token authenticates
    every connection (default: env RLINF_COMM_TOKEN).
    """

    _current: ClassVar[Endpoint | None] = None
    _current_lock: ClassVar[threading.Lock] = threading.Lock()

    def __init__(
        self,
        name: str | None = None,
        *,
        store: Store,
        token: bytes | None = None,
        locality: tp.Locality | None = None,
        config: EndpointConfig = EndpointConfig(),
    ) -> None:
        self.name = name or f"{socket.gethostname()}-{os.getpid()}-{uuid.uuid4().hex[:8]}"
        self.store = store
        self.token = token if token is not None else wire.default_token()
        self.config = config if config.host else replace(config, host=default_listen_host())
        self.locality = locality if locality is not None else tp.Locality.current()
        if config.pool_free_bytes is not None:
            pool = shm.default_pool()
            pool.max_free_bytes = max(pool.max_free_bytes, config.pool_free_bytes)
        self._exports: dict[int, _Export] = {}
        self._xids = itertools.count(1)
        self._lock = threading.Lock()
        self._inboxes: dict[str, _Inbox] = {}
        self._peers: dict[str, RpcPeer] = {}  # outgoing connections, by peer name
        self._incoming: dict[str, RpcPeer] = {}  # connections peers opened to us
        self._peer_info: dict[str, Header] = {}
        self._peer_locality: dict[str, tp.Locality] = {}
        self._connect_locks: dict[str, threading.Lock] = {}
        self._senders: dict[str, ThreadPoolExecutor] = {}
        self._isends: set[Future[None]] = set()  # not finished yet: close() waits for them
        self._releaser = _Releaser()
        self._deadlines = Deadlines(name=f"endpoint-{self.name}")
        self._closed = False
        self._server = RpcServer(
            name=f"endpoint {self.name}", token=self.token, host=self.config.host,
            on_message=self._on_incoming, on_close=self._incoming_closed,
        )
        self.address = self._server.address
        self.info: Header = {
            "name": self.name, "address": list(self.address),
            "locality": self.locality.to_dict(),
        }
        try:  # a name whose holder died (SIGKILL left its record) is taken over
            names.claim(store, _store_key(self.name), self.info, name=self.name,
                        what="endpoint", token=self.token)
        except BaseException:
            self._server.close()
            self._deadlines.close()
            raise
        log.debug("endpoint_started", endpoint=self.name, address=self.address)

    @classmethod
    def current(cls, *, store: Store | None = None) -> Endpoint:
        """This process's endpoint; the first call creates one (auto-named) in `store`."""
        with cls._current_lock:
            if cls._current is None or cls._current._closed:
                if store is None:
                    raise errors.CommError(
                        "expected an endpoint for this process; none exists yet and no store "
                        "was given to create one"
                    )
                cls._current = cls(store=store)
            return cls._current

    def make_current(self) -> Endpoint:
        """Make this endpoint the one `Endpoint.current()` returns (e.g. for channels)."""
        with Endpoint._current_lock:
            Endpoint._current = self
        return self

    # -- point to point ---------------------------------------------------------------
    def send(
        self,
        batch: Batch | dict[str, Array],
        dst: str,
        *,
        timeout: float | None = None,
        transport: str | None = None,
    ) -> None:
        """Send `batch` to endpoint `dst`; returns once the message is on its way.

        The caller may reuse its arrays when `send` returns, except with the in-process
        transport (`dst` in this process), which hands over references. A message sent
        before `close()` is delivered even if this process exits right after (see `close`).
        """
        self._check_open()
        self._send(Batch.of(batch), dst, self._timeout(timeout), transport)

    def isend(
        self,
        batch: Batch | dict[str, Array],
        dst: str,
        *,
        timeout: float | None = None,
        transport: str | None = None,
    ) -> Work[None]:
        """Non-blocking `send`; sends to one `dst` leave in call order."""
        self._check_open()
        b = Batch.of(batch)
        limit = self._timeout(timeout)
        with self._lock:
            executor = self._senders.get(dst)
            if executor is None:
                executor = ThreadPoolExecutor(1, thread_name_prefix=f"isend-{dst}")
                self._senders[dst] = executor
            fut = executor.submit(self._send, b, dst, limit, transport)
            self._isends.add(fut)
        fut.add_done_callback(self._isend_done)
        return Work(fut, description=f"isend to {dst!r}")

    def _isend_done(self, fut: Future[None]) -> None:
        with self._lock:
            self._isends.discard(fut)

    def recv(self, src: str, *, timeout: float | None = None) -> Batch:
        """Receive the next batch `src` sent to this endpoint (FIFO per source)."""
        limit = self._timeout(timeout)
        deadline = time.monotonic() + limit
        fut: Future[Batch] = Future()
        with self._lock:
            inbox = self._inboxes.setdefault(src, _Inbox())
            message = inbox.messages.popleft() if inbox.messages else None
            waiter = _Waiter(fut)  # no timer: this thread enforces the deadline itself
            if message is None:
                if inbox.dead is not None:
                    raise errors.PeerDiedError(inbox.dead)
                inbox.waiters.append(waiter)
        if message is not None:
            self._fulfil(fut, message)
            return fut.result()
        peer = self._incoming.get(src)
        if peer is not None:
            # Read src's connection in this thread: no handoff from the reader thread.
            peer.read_direct(fut.done, deadline=deadline)
        try:
            return fut.result(timeout=max(deadline - time.monotonic(), 0))
        except TimeoutError:
            with self._lock:
                if waiter not in inbox.waiters:  # delivered just now after all
                    return fut.result()
                inbox.waiters.remove(waiter)
            raise errors.CommTimeoutError(
                f"expected a message from endpoint {src!r} within {limit:.3g} s; got none"
            ) from None

    def shares_memory_with(self, dst: str, *, timeout: float | None = None) -> bool:
        """Whether endpoint `dst`'s process runs on this node, in this kernel and pid
        namespace, so that a `ShmRing` can join the two (connects to `dst` if needed)."""
        self._peer(dst, deadline=time.monotonic() + self._timeout(timeout))
        stamp = self._peer_info[dst].get("process")
        return (self.locality.same_node(self._peer_locality[dst]) and isinstance(stamp, dict)
                and stamp.get("namespace") == process_stamp()["namespace"] != "")

    def irecv(self, src: str, *, timeout: float | None = None) -> Work[Batch]:
        """Non-blocking `recv`: the Work fails with CommTimeoutError after `timeout` s."""
        limit = self._timeout(timeout)
        fut: Future[Batch] = Future()
        work = Work(fut, description=f"irecv from {src!r}")
        with self._lock:
            inbox = self._inboxes.setdefault(src, _Inbox())
            message = inbox.messages.popleft() if inbox.messages else None
            if message is None:
                if inbox.dead is not None:
                    fut.set_exception(errors.PeerDiedError(inbox.dead))
                    return work
                waiter = _Waiter(fut)
                inbox.waiters.append(waiter)
                # Scheduled under the lock so that a delivery cannot miss the handle.
                waiter.deadline = self._deadlines.schedule(
                    time.monotonic() + limit, lambda: self._expire_recv(inbox, waiter, src, limit)
                )
        if message is not None:
            self._fulfil(fut, message)
        return work

    def _expire_recv(self, inbox: _Inbox, waiter: _Waiter, src: str, limit: float) -> None:
        with self._lock:
            if waiter not in inbox.waiters:
                return
            inbox.waiters.remove(waiter)
        waiter.future.set_exception(errors.CommTimeoutError(
            f"expected a message from endpoint {src!r} within {limit:.3g} s; got none"
        ))

    def _send(self, batch: Batch, dst: str, limit: float, transport: str | None) -> None:
        deadline = time.monotonic() + limit
        peer = self._peer(dst, deadline=deadline)
        dst_locality = self._peer_locality[dst]
        if transport is None and layout.inline_ok(
            batch, self.config.eager_bytes, self.locality, dst_locality
        ):
            header, buffers = layout.inline_message(batch)
            header["src"] = self.name
            try:  # what the lookup and connect left of the timeout, not all of it again
                peer.conn.send(header, buffers, timeout=max(deadline - time.monotonic(), 0))
            except errors.PeerDiedError as exc:
                raise errors.PeerDiedError(f"endpoint {dst!r} died or left: {exc}") from exc
            return
        chosen = self._choose(batch, dst_locality, transport)
        exported = chosen.export(batch, peer=dst)
        # Transports that copy (TCP) hold nothing after export: no acknowledgement needed.
        xid = self._register(chosen, exported, peer=dst) if chosen.needs_release else 0
        header = {"op": "data", "src": self.name, "xid": xid, "t": chosen.name,
                  "d": exported.descriptor}
        try:
            peer.conn.send(header, exported.buffers, timeout=max(deadline - time.monotonic(), 0))
        except errors.PeerDiedError as exc:
            self.release_exports([xid])
            raise errors.PeerDiedError(f"endpoint {dst!r} died or left: {exc}") from exc
        except BaseException:
            self.release_exports([xid])
            raise

    def _choose(self, batch: Batch, dst: tp.Locality, override: str | None) -> tp.Transport:
        name = tp.select_transport(self.locality, dst, batch, override=override)
        if override is None and name == "shm" and batch.nbytes <= self.config.eager_bytes:
            # Eager protocol: a small payload costs less inline in the frame than a
            # segment lent out and acknowledged.
            name = "tcp"
        return tp.get_transport(name)

    def _fulfil(self, fut: Future[Batch], message: _Message) -> None:
        opened = message.opened
        if opened is None:
            try:
                opened = self._open_message(message.header, message.buffers, message.peer)
            except BaseException as exc:
                opened = exc
        if isinstance(opened, BaseException):
            fut.set_exception(opened)
        else:
            fut.set_result(opened)

    def _open_message(self, header: Header, buffers: Buffers, peer: RpcPeer) -> Batch:
        if header["t"] == layout.INLINE:
            return layout.open_inline(header["d"], buffers)
        transport = tp.get_transport(str(header["t"]))
        xid = int(header["xid"])
        if not xid:
            return transport.open(header["d"], buffers)
        return transport.open(
            header["d"], buffers, on_release=lambda _d: self._releaser.post(peer, "xids", xid)
        )

    # -- exports (payloads others hold) -------------------------------------------------
    def _register(self, transport: tp.Transport, exported: tp.Exported, *, peer: str | None) -> int:
        with self._lock:
            xid = next(self._xids)
            self._exports[xid] = _Export(transport, exported, peer)
        return xid

    def export_payload(self, batch: Batch, *, transport: str | None = None) -> tuple[int, Header]:
        """Export `batch` for a consumer not known yet (channels): returns its id and a
        JSON descriptor that any process can open with `open_payload`."""
        # The consumer is not known yet: export as for another process on this node (a
        # consumer on another node fetches the payload from us, see `open_payload`).
        name = tp.select_transport(
            self.locality, self.locality.elsewhere_on_node(), batch, override=transport
        )
        chosen = tp.get_transport(name)
        exported = chosen.export(batch)
        if exported.buffers:
            chosen.release(exported.descriptor)
            raise errors.TransportError(
                f"expected a transport that leaves the payload in place for channel items; "
                f"{chosen.name!r} carries the bytes with the descriptor"
            )
        xid = self._register(chosen, exported, peer=None)
        return xid, {"xid": xid, "t": chosen.name, "d": exported.descriptor}

    def export_payloads(
        self, batches: list[Batch], *, transport: str | None = None
    ) -> list[tuple[int, Header]]:
        """`export_payload` for several batches; small host batches share segments.

        One segment per payload costs a segment acquisition and, on the reader's side, a
        mapping each; packing small payloads (`EndpointConfig.pack_bytes`) into shared
        arenas makes many small items as cheap as one.
        """
        out: list[tuple[int, Header] | None] = [None] * len(batches)
        small: list[tuple[int, layout.Packed]] = []
        try:
            for i, batch in enumerate(batches):
                name = tp.select_transport(
                    self.locality, self.locality.elsewhere_on_node(), batch, override=transport
                )
                raw = layout.RawLayout.of(batch) if name == "shm" else None
                if raw is not None and raw.nbytes > self.config.pack_bytes:
                    out[i] = self._export_arena([raw])[0]  # a segment of its own
                    continue
                if name == "shm" and batch.nbytes <= self.config.pack_bytes:
                    packed = raw or codec.plan_encoding(batch)
                    if packed.nbytes <= self.config.pack_bytes:
                        small.append((i, packed))
                        continue
                out[i] = self.export_payload(batch, transport=name)
            while small:
                group: list[tuple[int, layout.Packed]] = []
                used = 0
                while small and (not group or used + layout.align(small[0][1].nbytes)
                                 <= self.config.arena_bytes):
                    group.append(small.pop(0))
                    used += layout.align(group[-1][1].nbytes)
                for i, payload in zip(
                    [i for i, _ in group], self._export_arena([p for _, p in group]), strict=True
                ):
                    out[i] = payload
        except BaseException:
            self.release_exports([p[0] for p in out if p is not None])
            raise
        return [p for p in out if p is not None]

    def _export_arena(self, plans: list[layout.Packed]) -> list[tuple[int, Header]]:
        pool = shm.default_pool()
        segment = pool.acquire(sum(layout.align(p.nbytes) for p in plans))
        arena = _Arena(segment.name, len(plans))
        transport = tp.get_transport("shm")
        out = []
        offset = 0
        try:
            for plan in plans:
                plan.write_into(segment.view[offset:offset + plan.nbytes])
                descriptor = {"transport": "shm", "name": segment.name, "offset": offset,
                              "nbytes": plan.nbytes, "pid": os.getpid()}
                if isinstance(plan, layout.RawLayout):
                    descriptor["raw"] = plan.describe()
                with self._lock:
                    xid = next(self._xids)
                    self._exports[xid] = _Export(
                        transport, tp.Exported(descriptor), None, arena=arena
                    )
                out.append((xid, {"xid": xid, "t": "shm", "d": descriptor}))
                offset += layout.align(plan.nbytes)
        except BaseException:
            with self._lock:
                for xid, _ in out:
                    self._exports.pop(xid, None)
            pool.release(segment.name)
            raise
        return out

    def release_exports(self, xids: list[int]) -> None:
        """The consumers are done with these payloads: the transports may reuse them."""
        for xid in xids:
            free_arena = None
            with self._lock:
                export = self._exports.pop(xid, None)
                if export is not None and export.arena is not None:
                    export.arena.live -= 1
                    if export.arena.live == 0:
                        free_arena = export.arena.segment
            if export is None:
                continue
            if export.arena is None:
                export.transport.release(export.exported.descriptor)
            elif free_arena is not None:
                shm.default_pool().release(free_arena)

    def post_release(self, peer: Notifier, field_name: str, ident: int) -> None:
        """Queue a release acknowledgement (safe from GC callbacks)."""
        self._releaser.post(peer, field_name, ident)

    def open_payload(
        self, payload: Header, *, producer: Header, on_release: Callable[[], None]
    ) -> Batch:
        """Open a payload another endpoint exported (see `export_payload`).

        On the producer's node the payload is mapped in place; from another node it is
        fetched from the producer's endpoint over TCP (and released at once: we hold a copy).
        """
        theirs = tp.Locality.from_dict(producer["locality"])
        transport = tp.get_transport(str(payload["t"]))
        if self.locality.same_node(theirs):
            try:
                if "raw" in payload["d"]:
                    return layout.open_raw(payload["d"], on_release=on_release)
                return transport.open(payload["d"], [], on_release=lambda _d: on_release())
            except errors.TransportError as exc:
                if _alive(theirs.pid):
                    raise
                raise errors.PeerDiedError(
                    f"producer endpoint {producer.get('name')!r} (pid {theirs.pid}) died; "
                    f"its payload is lost ({exc})"
                ) from exc
        deadline = time.monotonic() + self.config.timeout
        peer = self._peer(str(producer["name"]), deadline=deadline)
        reply, buffers = peer.call({"op": "fetch", "xid": int(payload["xid"])},
                                   timeout=max(deadline - time.monotonic(), 0))
        on_release()
        return tp.get_transport(str(reply["t"])).open(reply["d"], buffers)

    def _serve_fetch(self, peer: RpcPeer, header: Header) -> None:
        with self._lock:
            export = self._exports.get(int(header["xid"]))
        if export is None:
            peer.reply_error(header, errors.TransportError(
                f"expected payload {header['xid']} to be held by endpoint {self.name!r}; "
                "it was released or never existed"
            ))
            return
        descriptor = export.exported.descriptor
        if "raw" in descriptor:
            local = layout.open_raw(descriptor, on_release=None)
        else:
            local = export.transport.open(descriptor, list(export.exported.buffers))
        tcp = tp.get_transport("tcp")
        out = tcp.export(local)
        peer.reply(header, {"t": tcp.name, "d": out.descriptor}, out.buffers)

    # -- connections ------------------------------------------------------------------
    def _peer(self, dst: str, *, deadline: float) -> RpcPeer:
        """The connection to `dst`, made (store lookup, connect, handshake) by `deadline`."""
        peer = self._peers.get(dst)
        if peer is not None and not peer.closed:
            return peer
        with self._lock:
            lock = self._connect_locks.setdefault(dst, threading.Lock())
        with lock:
            peer = self._peers.get(dst)
            if peer is not None and not peer.closed:
                return peer
            info = json.loads(self.store.get(_store_key(dst),
                                             timeout=max(deadline - time.monotonic(), 0)))
            try:
                conn = wire.connect(
                    tuple(info["address"]), token=self.token,
                    timeout=min(max(deadline - time.monotonic(), 0),
                                self.config.connect_timeout),
                )
            except errors.PeerDiedError as exc:
                raise errors.PeerDiedError(
                    f"expected endpoint {dst!r} at {info['address']}; it is gone ({exc})"
                ) from exc
            def closed(peer: RpcPeer, exc: BaseException, dst: str = dst) -> None:
                self._outgoing_closed(dst, peer)

            peer = RpcPeer(
                conn, name=f"endpoint {dst!r}", on_message=self._on_outgoing, on_close=closed
            ).start()
            peer.notify({"op": "hello", "endpoint": self.info})
            self._peer_info[dst] = info
            self._peer_locality[dst] = tp.Locality.from_dict(info["locality"])
            self._peers[dst] = peer
            return peer

    def _on_outgoing(self, peer: RpcPeer, header: Header, buffers: Buffers) -> None:
        if header.get("op") == "release":
            self.release_exports([int(x) for x in header["xids"]])

    def _outgoing_closed(self, dst: str, peer: RpcPeer) -> None:
        # The receiver is gone: nobody will release what we sent it, and receives waiting
        # on it would wait in vain (even if it never sent us anything).
        with self._lock:
            if self._peers.get(dst) is peer:
                del self._peers[dst]
            orphans = [x for x, e in self._exports.items() if e.peer == dst]
        self.release_exports(orphans)
        if not self._closed:
            self._mark_dead(dst, f"endpoint {dst!r} died or closed its connection")

    def _on_incoming(self, peer: RpcPeer, header: Header, buffers: Buffers) -> None:
        op = header.get("op")
        if op == "data":
            src = str(header["src"])
            with self._lock:
                inbox = self._inboxes.setdefault(src, _Inbox())
                waiter = inbox.waiters.popleft() if inbox.waiters else None
                if waiter is None:
                    inbox.messages.append(_Message(header, buffers, peer))
                elif waiter.deadline >= 0:  # an irecv's timer (a blocking recv has none)
                    self._deadlines.cancel(waiter.deadline)
            if waiter is not None:
                self._fulfil(waiter.future, _Message(header, buffers, peer))
        elif op == "bye":
            self._take_in(str(header["src"]))
            peer.reply(header, {})
        elif op == "hello":
            peer.info = dict(header["endpoint"])
            peer.name = f"endpoint {peer.info.get('name')!r}"
            with self._lock:  # a (re)started peer of that name is alive
                self._inboxes.setdefault(str(peer.info.get("name")), _Inbox()).dead = None
                self._incoming[str(peer.info.get("name"))] = peer
        elif op == "fetch":
            self._serve_fetch(peer, header)
        elif op == "whoami":  # a newcomer asking for our name checks we are alive
            peer.reply(header, {"name": self.name})
        elif op == "release":  # from a consumer that fetched over our incoming connection
            self.release_exports([int(x) for x in header["xids"]])

    def _take_in(self, src: str) -> None:
        """`src` is closing: open every message it sent that still needs its memory.

        Its frames all arrived before its "bye" (one connection, in order), but a payload
        left in its shared memory is only ours once mapped: after `src` exits its segment
        names are gone. Mapped now, the message outlives the sender; inline and TCP
        payloads already live in our frame buffers.
        """
        with self._lock:  # opening maps and decodes only: it never takes this lock
            inbox = self._inboxes.get(src)
            for message in inbox.messages if inbox is not None else ():
                if message.opened is None and int(message.header.get("xid", 0)):
                    try:
                        message.opened = self._open_message(
                            message.header, message.buffers, message.peer)
                    except Exception as exc:  # the receive that takes it raises it
                        message.opened = exc

    def _incoming_closed(self, peer: RpcPeer, exc: BaseException) -> None:
        src = peer.info.get("name")
        with self._lock:
            if self._incoming.get(str(src)) is peer:
                del self._incoming[str(src)]
        if src is not None:
            self._mark_dead(str(src), f"endpoint {src!r} died or closed its connection ({exc})")

    def _mark_dead(self, src: str, reason: str) -> None:
        """Fail the receives waiting on `src` (once its delivered messages are taken)."""
        with self._lock:
            inbox = self._inboxes.setdefault(src, _Inbox())
            inbox.dead = reason
            waiters = list(inbox.waiters) if not inbox.messages else []
            if waiters:
                inbox.waiters.clear()
            for waiter in waiters:
                if waiter.deadline >= 0:
                    self._deadlines.cancel(waiter.deadline)
        for waiter in waiters:
            waiter.future.set_exception(errors.PeerDiedError(reason))

    # -- lifecycle --------------------------------------------------------------------
    def _timeout(self, timeout: float | None) -> float:
        return check_timeout(self.config.timeout if timeout is None else timeout)

    def _check_open(self) -> None:
        if self._closed:
            raise errors.CommError(f"expected an open endpoint; {self.name!r} was closed")

    def close(self, *, timeout: float | None = None) -> None:
        """Leave: deliver what was sent, unregister, close connections, free payloads.

        Every message a `send` returned for (and every `isend` issued before `close`)
        reaches its receiver, even if this process exits right after: close first lets
        pending isends finish, then has each live peer it sent to confirm that it took in
        everything from us (every frame read, every shared-memory payload mapped, so it
        outlives our segments' names). Payloads a receiver may still read are never
        recycled afterwards. A peer that died is skipped: its messages died with it. If a
        live peer does not confirm, or an isend does not finish, within `timeout` (None:
        `EndpointConfig.close_timeout`), close still releases everything and then raises
        CommTimeoutError naming them: those messages may be lost.
        """
        if self._closed:
            return
        limit = check_timeout(self.config.close_timeout if timeout is None else timeout)
        deadline = time.monotonic() + limit
        self._closed = True  # no new sends from here on
        unconfirmed = self._finish_isends(deadline) + self._say_bye(deadline)
        try:
            self.store.delete(_store_key(self.name))
        except errors.CommError as exc:
            log.debug("endpoint_unregister_failed", endpoint=self.name, error=str(exc))
        for executor in self._senders.values():
            executor.shutdown(wait=False, cancel_futures=True)
        # Before the connections close (which releases what a peer still holds): a payload
        # sent to a peer may be in use there, so it is freed without being reused.
        with self._lock:
            sent = [xid for xid, export in self._exports.items() if export.peer is not None]
        self._discard_exports(sent)
        self._server.close()
        for peer in list(self._peers.values()):
            peer.close()
        self._releaser.close()
        self._deadlines.close()
        with self._lock:
            xids = list(self._exports)
        self.release_exports(xids)
        if unconfirmed:
            raise errors.CommTimeoutError(
                f"expected endpoint {self.name!r} to deliver what it sent before close within "
                f"{limit:.3g} s; not confirmed: {'; '.join(unconfirmed)} (may be lost)"
            )

    def _finish_isends(self, deadline: float) -> list[str]:
        with self._lock:
            pending = list(self._isends)
        if not pending:
            return []
        _, running = wait_all(pending, timeout=max(deadline - time.monotonic(), 0))
        for fut in running:
            fut.cancel()  # one not started yet never starts; its Work reports it
        return [f"{len(running)} isend(s) still running"] if running else []

    def _say_bye(self, deadline: float) -> list[str]:
        """Each live peer we sent to answers "bye" once it took in all we sent (`_take_in`)."""
        calls = [(dst, peer.call_async({"op": "bye", "src": self.name},
                                       timeout=max(deadline - time.monotonic(), 0)))
                 for dst, peer in list(self._peers.items()) if not peer.closed]
        unconfirmed = []
        for dst, call in calls:
            try:
                wait_future(call, timeout=max(deadline - time.monotonic(), 0),
                            what=f"endpoint {dst!r} to confirm delivery")
            except errors.CommTimeoutError:
                unconfirmed.append(f"endpoint {dst!r}")
            except errors.PeerDiedError as exc:  # gone: nobody is left to deliver to
                log.debug("endpoint_bye_to_dead_peer", endpoint=self.name, peer=dst,
                          error=str(exc))
        return unconfirmed

    def _discard_exports(self, xids: list[int]) -> None:
        for xid in xids:
            with self._lock:
                export = self._exports.pop(xid, None)
            if export is not None:
                export.transport.discard(export.exported.descriptor)

    def __enter__(self) -> Endpoint:
        return self

    def __exit__(self, exc_type: type[BaseException] | None, *rest: object) -> None:
        if exc_type is None:
            self.close()
            return
        try:  # an error is already on its way: do not replace it with close's
            self.close()
        except errors.CommError as exc:
            log.warning("endpoint_close_failed", endpoint=self.name, error=str(exc))

    def __repr__(self) -> str:
        return f"Endpoint({self.name!r}, address={self.address})"
