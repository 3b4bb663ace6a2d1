"""Other node, GPU data: NCCL point-to-point send/recv through cupy's NCCL bindings.

Each direction between two processes is one *link* with its own two-rank communicator
and stream (NCCL communicators must not be driven from two threads at once, and a
process may send and receive with the same peer concurrently). The sender is rank 0: it
creates the NCCL unique id and publishes it in the rendezvous store under
``rlinf/nccl/<src>-><dst>``; the receiver, rank 1, reads it from there. Creating the
communicator is collective (both sides block until both join), so the owner never does
it inside `export`: a per-link sender thread creates it and issues the sends, in export
order, while `export` returns the descriptor at once. The receiver joins the
communicator in its first `open` and posts the matching receives.

NCCL matches sends and receives by order, so descriptors from one sender must be
opened in the order they were exported (point-to-point receive does this naturally);
`open` checks the sequence number and raises `TransportError` otherwise. Every wait
has a deadline: a peer that never shows up aborts the communicator and raises
`CommTimeoutError` instead of hanging.

Arrays travel as raw bytes (any dtype); strided arrays are made contiguous on the GPU
first. Host arrays in the batch ride inline as Arrow IPC bytes. Each process uses its
current CUDA device.
"""

from __future__ import annotations

import itertools
import json
import queue
import sys
import threading
import time
from typing import Any, ClassVar, Protocol

from rlinf.comm._internal import codec
from rlinf.comm._internal.codec import Target
from rlinf.comm._internal.logs import get_logger
from rlinf.comm._internal.transports import gpu
from rlinf.comm._internal.transports.base import Exported, OnRelease, ReleaseOnce, Transport
from rlinf.comm.batch import Batch, array_kind, is_device_array
from rlinf.comm.errors import CommTimeoutError, TransportError

__all__ = ["KeyValueStore", "NcclTransport"]

log = get_logger(__name__)

_POLL_S = 0.0005


class KeyValueStore(Protocol):
    """The rendezvous store the NCCL transport needs (rlinf.comm's TCP store fits)."""

    def set(self, key: str, value: bytes) -> None: ...

    def get(self, key: str, *, timeout: float | None = None) -> bytes: ...


def _wait_stream(stream: Any, deadline: float, comm: Any, what: str) -> None:
    # Stream.synchronize() would block forever on a missing peer; poll with a deadline.
    while not stream.done:
        if time.monotonic() > deadline:
            comm.abort()
            raise CommTimeoutError(f"{what}: NCCL did not complete before the deadline; "
                                   "communicator aborted (is the peer alive?)")
        time.sleep(_POLL_S)


class _Link:
    """One direction to or from one peer: communicator and stream, created lazily."""

    def __init__(self, transport: NcclTransport, peer: str, *, sending: bool) -> None:
        self.peer = peer
        me = transport.self_id
        self.rank = 0 if sending else 1
        self.key = f"rlinf/nccl/{me}->{peer}" if sending else f"rlinf/nccl/{peer}->{me}"
        self._transport = transport
        self._lock = threading.Lock()
        self.recv_lock = threading.Lock()  # receives on one link run one at a time
        self._comm: Any = None
        self._stream: Any = None
        self.device = -1
        self.send_seq = itertools.count()
        self.recv_seq = 0
        self.error: BaseException | None = None
        self._queue: queue.Queue[tuple[int, list[Any]] | None] = queue.Queue()  # (device, arrays)
        self._thread: threading.Thread | None = None

    def comm(self, timeout: float, device: int) -> tuple[Any, Any]:
        """The communicator and its stream, bound to CUDA `device` on first use."""
        with self._lock:
            if self._comm is None:
                cupy = gpu.cupy_module("the NCCL transport")
                nccl = gpu.nccl_module("the NCCL transport")
                self.device = device

                store = self._transport.store
                if self.rank == 0:
                    uid = nccl.get_unique_id()
                    store.set(self.key, json.dumps(list(uid)).encode())
                else:
                    uid = tuple(json.loads(store.get(self.key, timeout=timeout)))
                with cupy.cuda.Device(device):
                    self._stream = cupy.cuda.Stream(non_blocking=True)
                    self._comm = nccl.NcclCommunicator(2, uid, self.rank)
                log.debug("nccl_link_ready", peer=self.peer, rank=self.rank)
            return self._comm, self._stream

    def enqueue(self, seq: int, device: int, arrays: list[Any]) -> None:
        if self.error is not None:
            raise TransportError(f"NCCL sends to {self.peer!r} failed earlier: {self.error}")
        if self._thread is None:
            self._thread = threading.Thread(target=self._send_loop, daemon=True,
                                            name=f"rlinf-nccl-send-{self.peer}")
            self._thread.start()
        self._queue.put((device, arrays))

    def _send_loop(self) -> None:
        cupy = gpu.cupy_module("the NCCL transport")
        nccl = gpu.nccl_module("the NCCL transport")
        timeout = self._transport.timeout
        while (item := self._queue.get()) is not None:
            device, arrays = item
            del item
            try:
                comm, stream = self.comm(timeout, device)
                with cupy.cuda.Device(self.device):
                    nccl.groupStart()
                    for ptr, nbytes, _keepalive in arrays:
                        comm.send(ptr, nbytes, nccl.NCCL_UINT8, 1 - self.rank, stream.ptr)
                    nccl.groupEnd()
                _wait_stream(stream, time.monotonic() + timeout, comm, f"send to {self.peer}")
            except BaseException as exc:
                self.error = exc
                log.warning("nccl_send_failed", peer=self.peer, error=repr(exc))
                self._queue.task_done()
                return
            finally:
                # `arrays` kept the (contiguous) device buffers alive until now.
                del arrays
            self._queue.task_done()

    def drain(self, deadline: float) -> None:
        while self._queue.unfinished_tasks and self.error is None:
            if time.monotonic() > deadline:
                raise CommTimeoutError(f"NCCL sends to {self.peer!r} still pending at the "
                                       "deadline")
            time.sleep(_POLL_S)
        if self.error is not None:
            raise TransportError(f"NCCL sends to {self.peer!r} failed: {self.error}")

    def close(self) -> None:
        self._queue.put(None)


class NcclTransport(Transport):
    """One NCCL link per peer and direction; configure with a store and this process's id."""

    name: ClassVar[str] = "nccl"
    needs_release: ClassVar[bool] = False

    def __init__(self, *, store: KeyValueStore | None = None, self_id: str | None = None,
                 timeout: float = 300.0) -> None:
        self._store = store
        self._self_id = self_id
        self.timeout = timeout
        self._lock = threading.Lock()
        self._links: dict[tuple[str, bool], _Link] = {}

    def configure(self, *, store: KeyValueStore, self_id: str,
                  timeout: float | None = None) -> None:
        """Set the rendezvous store and this process's unique id (before first use)."""
        self._store, self._self_id = store, self_id
        if timeout is not None:
            self.timeout = timeout

    @property
    def store(self) -> KeyValueStore:
        if self._store is None:
            raise TransportError("expected NcclTransport.configure(store=..., self_id=...) "
                                 "before use, got an unconfigured transport")
        return self._store

    @property
    def self_id(self) -> str:
        if self._self_id is None:
            raise TransportError("expected NcclTransport.configure(store=..., self_id=...) "
                                 "before use, got an unconfigured transport")
        return self._self_id

    def _link(self, peer: str, *, sending: bool) -> _Link:
        with self._lock:
            link = self._links.get((peer, sending))
            if link is None:
                link = self._links[peer, sending] = _Link(self, peer, sending=sending)
            return link

    def export(self, batch: Batch, *, peer: str | None = None) -> Exported:
        batch = Batch.of(batch)
        if peer is None:
            raise TransportError("expected export(batch, peer=...) for NCCL, got no peer")
        cupy = gpu.cupy_module("the NCCL transport")
        gpu.nccl_module("the NCCL transport")
        specs, arrays, host = [], [], {}
        devices = set()
        for name, array in batch.tensors.items():
            if not is_device_array(array):
                host[name] = array
                continue
            kind = array_kind(array)
            devices.add(int(array.device.index if kind == "torch" else array.device.id))
            if kind == "torch":
                contiguous = array.detach().contiguous()
                gpu.torch_module("the NCCL transport").cuda.current_stream(
                    contiguous.device).synchronize()
                ptr, dtype = contiguous.data_ptr(), str(contiguous.dtype).removeprefix("torch.")
            else:
                contiguous = cupy.ascontiguousarray(array)
                cupy.cuda.get_current_stream().synchronize()
                ptr, dtype = int(contiguous.data.ptr), contiguous.dtype.str
            nbytes = int(contiguous.nbytes) if kind == "cupy" else (
                contiguous.numel() * contiguous.element_size())
            specs.append({"name": name, "kind": kind, "dtype": dtype,
                          "shape": list(array.shape), "nbytes": nbytes})
            arrays.append((ptr, nbytes, contiguous))
        if len(devices) > 1:
            raise TransportError(f"expected the GPU arrays of one batch on one device, got "
                                 f"devices {sorted(devices)}")
        link = self._link(peer, sending=True)
        seq = next(link.send_seq)
        if arrays:
            link.enqueue(seq, devices.pop(), arrays)
        buffers = [codec.encode(Batch(host))] if host else []
        return Exported({"transport": self.name, "src": self.self_id, "seq": seq,
                         "order": list(batch.tensors), "device": specs,
                         "host": bool(host), "meta": dict(batch.meta)}, buffers)

    def open(self, descriptor: dict[str, Any], buffers: list[memoryview], *,
             on_release: OnRelease | None = None, to: Target = "auto") -> Batch:
        self.check_descriptor(descriptor)
        link = self._link(str(descriptor["src"]), sending=False)
        tensors: dict[str, Any] = {}
        with link.recv_lock:
            if descriptor["seq"] != link.recv_seq:
                raise TransportError(f"expected NCCL message {link.recv_seq} from "
                                     f"{descriptor['src']!r}, got {descriptor['seq']}: open "
                                     "NCCL descriptors in the order they were sent")
            link.recv_seq += 1
            if descriptor["device"]:
                tensors.update(self._receive(link, descriptor))
        if descriptor.get("host"):
            tensors.update(codec.decode(buffers[0], to=to).tensors)
        ReleaseOnce(descriptor, on_release, count=0)  # the data is ours now
        return Batch({n: tensors[n] for n in descriptor["order"]}, descriptor.get("meta", {}))

    def _receive(self, link: _Link, descriptor: dict[str, Any]) -> dict[str, Any]:
        cupy = gpu.cupy_module("the NCCL transport")
        nccl = gpu.nccl_module("the NCCL transport")
        comm, stream = link.comm(self.timeout, _current_device(cupy))
        tensors: dict[str, Any] = {}
        with cupy.cuda.Device(link.device):
            nccl.groupStart()
            for spec in descriptor["device"]:
                out, ptr = _empty_like_spec(cupy, spec, link.device)
                tensors[spec["name"]] = out
                comm.recv(ptr, spec["nbytes"], nccl.NCCL_UINT8, 1 - link.rank, stream.ptr)
            nccl.groupEnd()
        _wait_stream(stream, time.monotonic() + self.timeout, comm,
                     f"recv from {descriptor['src']}")
        return tensors

    def drain(self, *, timeout: float) -> None:
        """Wait until every send exported so far has completed (or raise)."""
        deadline = time.monotonic() + timeout
        with self._lock:
            links = [link for (_, sending), link in self._links.items() if sending]
        for link in links:
            link.drain(deadline)

    def close(self) -> None:
        with self._lock:
            links, self._links = list(self._links.values()), {}
        for link in links:
            link.close()


def _current_device(cupy: Any) -> int:
    """This thread's CUDA device: torch's when torch is in use, else cupy's."""
    torch = sys.modules.get("torch")
    if torch is not None and torch.cuda.is_initialized():
        return int(torch.cuda.current_device())
    return int(cupy.cuda.Device().id)


def _empty_like_spec(cupy: Any, spec: dict[str, Any], device: int) -> tuple[Any, int]:
    if spec["kind"] == "torch":
        torch = gpu.torch_module("receiving torch tensors over NCCL")
        out = torch.empty(spec["shape"], dtype=getattr(torch, spec["dtype"]),
                          device=f"cuda:{device}")
        return out, int(out.data_ptr())
    out = cupy.empty(spec["shape"], dtype=spec["dtype"])
    return out, int(out.data.ptr)
