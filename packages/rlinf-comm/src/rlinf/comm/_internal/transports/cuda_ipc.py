"""Same node, GPU data: CUDA IPC memory handles (same GPU or another GPU of the node).

torch tensors go through torch's own IPC machinery (``UntypedStorage._share_cuda_`` /
``_new_shared_cuda``), which also keeps the producer's block alive while any consumer
still maps it and orders the consumer after the producer's stream with an IPC event.
cupy arrays use ``cudaIpcGetMemHandle`` on their allocation plus the offset in it; the
producer's stream is synchronised at export. GPUs are named by UUID, so differing
``CUDA_VISIBLE_DEVICES`` in the two processes do not matter. The receiver's array lives
on the producer's GPU (peer access, no copy); move it with ``.to()`` if needed.

Host arrays in the same batch travel through shared memory. The owner holds every
exported array until `release`.
"""

from __future__ import annotations

import itertools
import os
import threading
import weakref
from typing import Any, ClassVar

from rlinf.comm._internal.codec import Target
from rlinf.comm._internal.transports import gpu
from rlinf.comm._internal.transports.base import Exported, OnRelease, ReleaseOnce, Transport
from rlinf.comm._internal.transports.shared_memory import SharedMemoryTransport
from rlinf.comm.batch import Batch, array_kind, is_device_array
from rlinf.comm.errors import TransportError

__all__ = ["CudaIpcTransport"]


def _hex(value: bytes | None) -> str | None:
    return None if value is None else bytes(value).hex()


def _unhex(value: str | None) -> bytes | None:
    return None if value is None else bytes.fromhex(value)


class _CupyHandles:
    """Opened cupy IPC allocations of this process, reference counted by handle."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._open: dict[str, list[int]] = {}  # handle hex -> [base pointer, users]

    def acquire(self, cupy: Any, handle: str, device: int) -> int:
        with self._lock:
            entry = self._open.get(handle)
            if entry is None:
                with cupy.cuda.Device(device):
                    base = cupy.cuda.runtime.ipcOpenMemHandle(bytes.fromhex(handle))
                entry = self._open[handle] = [int(base), 0]
            entry[1] += 1
            return entry[0]

    def release(self, cupy: Any, handle: str) -> None:
        with self._lock:
            entry = self._open[handle]
            entry[1] -= 1
            if entry[1] == 0:
                del self._open[handle]
                cupy.cuda.runtime.ipcCloseMemHandle(entry[0])


_cupy_handles = _CupyHandles()


class _CupyOwner:
    """Owner object of an opened cupy allocation: closing happens when it dies."""

    def __init__(self, cupy: Any, handle: str, release: ReleaseOnce) -> None:
        weakref.finalize(self, _close_cupy, cupy, handle, release)


def _close_cupy(cupy: Any, handle: str, release: ReleaseOnce) -> None:
    _cupy_handles.release(cupy, handle)
    release.part_released()


class CudaIpcTransport(Transport):
    """Exports GPU arrays as IPC handles; the receiver maps the producer's memory."""

    name: ClassVar[str] = "cuda_ipc"

    def __init__(self, *, host: SharedMemoryTransport | None = None) -> None:
        self._host = host if host is not None else SharedMemoryTransport()
        self._lock = threading.Lock()
        self._held: dict[int, tuple[Batch, dict[str, Any] | None]] = {}
        self._ids = itertools.count()

    # -- owner side -------------------------------------------------------------------
    def export(self, batch: Batch, *, peer: str | None = None) -> Exported:
        batch = Batch.of(batch)
        device: dict[str, dict[str, Any]] = {}
        host: dict[str, Any] = {}
        for name, array in batch.tensors.items():
            if not is_device_array(array):
                host[name] = array
            elif array_kind(array) == "torch":
                device[name] = _export_torch(array)
            else:
                device[name] = _export_cupy(array)
        host_desc = self._host.export(Batch(host)).descriptor if host else None
        key = next(self._ids)
        with self._lock:
            self._held[key] = (batch, host_desc)
        return Exported({"transport": self.name, "pid": os.getpid(), "key": key,
                         "order": list(batch.tensors), "device": device, "host": host_desc,
                         "meta": dict(batch.meta)})

    def release(self, descriptor: dict[str, Any]) -> None:
        self.check_descriptor(descriptor)
        with self._lock:
            held = self._held.pop(int(descriptor["key"]), None)
        if held is not None and held[1] is not None:
            self._host.release(held[1])

    def close(self) -> None:
        with self._lock:
            held, self._held = list(self._held.values()), {}
        for _, host_desc in held:
            if host_desc is not None:
                self._host.release(host_desc)

    # -- receiver side ----------------------------------------------------------------
    def open(self, descriptor: dict[str, Any], buffers: list[memoryview], *,
             on_release: OnRelease | None = None, to: Target = "auto") -> Batch:
        self.check_descriptor(descriptor)
        if descriptor.get("pid") == os.getpid():
            # CUDA cannot open a process's own IPC handles: hand over the reference.
            with self._lock:
                held = self._held.get(int(descriptor["key"]))
            if held is None:
                raise TransportError(f"expected export {descriptor['key']} to be held, but "
                                     "it was released")
            ReleaseOnce(descriptor, on_release, count=0)
            return held[0]
        device: dict[str, dict[str, Any]] = descriptor["device"]
        host_desc = descriptor.get("host")
        release = ReleaseOnce(descriptor, on_release,
                              count=len(device) + (1 if host_desc else 0))
        tensors: dict[str, Any] = {}
        for name, spec in device.items():
            if spec["kind"] == "torch":
                tensors[name] = _open_torch(spec)
                weakref.finalize(tensors[name], release.part_released)
            else:
                tensors[name] = _open_cupy(spec, release)
        if host_desc:
            host = self._host.open(host_desc, [], to=to,
                                   on_release=lambda _d: release.part_released())
            tensors.update(host.tensors)
        ordered = {name: tensors[name] for name in descriptor["order"]}
        return Batch(ordered, descriptor.get("meta", {}))


def _export_torch(tensor: Any) -> dict[str, Any]:
    storage = tensor.untyped_storage()
    (device, handle, size, offset_bytes, ref_handle, ref_offset, event_handle,
     event_sync) = storage._share_cuda_()
    return {
        "kind": "torch", "dtype": str(tensor.dtype).removeprefix("torch."),
        "shape": list(tensor.shape), "stride": list(tensor.stride()),
        "storage_offset": int(tensor.storage_offset()),
        "device_uuid": gpu.uuid_of("torch", int(device)), "handle": _hex(handle),
        "storage_size": int(size), "storage_offset_bytes": int(offset_bytes),
        "ref_handle": _hex(ref_handle), "ref_offset": int(ref_offset),
        "event_handle": _hex(event_handle), "event_sync": bool(event_sync),
    }


def _open_torch(spec: dict[str, Any]) -> Any:
    torch = gpu.torch_module("opening CUDA IPC tensors")
    index = gpu.local_index_of("torch", spec["device_uuid"])
    dtype = getattr(torch, spec["dtype"])
    if spec["storage_size"] == 0 or spec["handle"] is None:
        return torch.empty(spec["shape"], dtype=dtype, device=f"cuda:{index}")
    torch.cuda._lazy_init()
    storage = torch.UntypedStorage._new_shared_cuda(
        index, _unhex(spec["handle"]), spec["storage_size"], spec["storage_offset_bytes"],
        _unhex(spec["ref_handle"]), spec["ref_offset"], _unhex(spec["event_handle"]),
        spec["event_sync"])
    tensor = torch.empty((0,), dtype=dtype, device=f"cuda:{index}")
    return tensor.set_(storage, spec["storage_offset"], spec["shape"], spec["stride"])


def _export_cupy(array: Any) -> dict[str, Any]:
    cupy = gpu.cupy_module("exporting cupy arrays over CUDA IPC")
    device = int(array.device.id)
    with cupy.cuda.Device(device):
        # Receivers read without our stream: finish pending writes first.
        cupy.cuda.get_current_stream().synchronize()
        ptr = int(array.data.ptr)
        if array.nbytes == 0:
            return {"kind": "cupy", "dtype": array.dtype.str, "shape": list(array.shape),
                    "device_uuid": gpu.uuid_of("cupy", device), "handle": None}
        base, size = gpu.allocation_range(ptr)
        handle = cupy.cuda.runtime.ipcGetMemHandle(base)
    return {
        "kind": "cupy", "dtype": array.dtype.str, "shape": list(array.shape),
        "strides": list(array.strides), "offset": ptr - base, "alloc_size": size,
        "device_uuid": gpu.uuid_of("cupy", device), "handle": bytes(handle).hex(),
    }


def _open_cupy(spec: dict[str, Any], release: ReleaseOnce) -> Any:
    cupy = gpu.cupy_module("opening CUDA IPC arrays")
    index = gpu.local_index_of("cupy", spec["device_uuid"])
    if spec["handle"] is None:
        release.part_released()
        with cupy.cuda.Device(index):
            return cupy.empty(spec["shape"], dtype=spec["dtype"])
    base = _cupy_handles.acquire(cupy, spec["handle"], index)
    owner = _CupyOwner(cupy, spec["handle"], release)
    memory = cupy.cuda.UnownedMemory(base, spec["alloc_size"], owner, index)
    pointer = cupy.cuda.MemoryPointer(memory, spec["offset"])
    return cupy.ndarray(spec["shape"], dtype=spec["dtype"], memptr=pointer,
                        strides=spec["strides"])
