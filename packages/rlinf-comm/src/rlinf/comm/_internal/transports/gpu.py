"""Lazy access to torch/cupy CUDA and GPU identity shared by the GPU transports.

Nothing here imports torch or cupy at module level; each helper imports what it needs
and raises `MissingExtraError` naming the extra to install when it is missing.
"""

from __future__ import annotations

import ctypes
import functools
import uuid
from typing import Any

from rlinf.comm.errors import MissingExtraError, TransportError

__all__ = [
    "allocation_range",
    "cupy_module",
    "local_index_of",
    "nccl_module",
    "torch_module",
    "uuid_of",
]


def torch_module(feature: str) -> Any:
    try:
        import torch
    except ImportError as exc:
        raise MissingExtraError(feature, "torch", "torch") from exc
    return torch


def cupy_module(feature: str) -> Any:
    try:
        import cupy
    except ImportError as exc:
        raise MissingExtraError(feature, "cuda", "cupy") from exc
    return cupy


def nccl_module(feature: str) -> Any:
    """cupy's NCCL bindings (cupy wheels need the NCCL library installed beside them)."""
    cupy_module(feature)
    try:
        from cupy.cuda import nccl
    except ImportError as exc:
        raise MissingExtraError(feature, "cuda", "cupy.cuda.nccl (NCCL library)") from exc
    return nccl


def _format_uuid(raw: Any) -> str:
    if isinstance(raw, bytes | bytearray):
        return "GPU-" + str(uuid.UUID(bytes=bytes(raw[:16])))
    text = str(raw)
    return text if text.startswith("GPU-") else "GPU-" + text


def uuid_of(kind: str, index: int) -> str:
    """UUID of this process's CUDA device `index`, asked through torch or cupy."""
    if kind == "torch":
        torch = torch_module("CUDA device identification")
        return _format_uuid(torch.cuda.get_device_properties(index).uuid)
    cupy = cupy_module("CUDA device identification")
    raw = cupy.cuda.runtime.getDeviceProperties(index).get("uuid")
    if isinstance(raw, str) or (isinstance(raw, bytes | bytearray) and len(raw) >= 16):
        return _format_uuid(raw)
    # cupy 14 hands the 16-byte char array back cut short (seen on an H100): ask NVML for
    # the UUID of the device at this PCI bus id, the one torch and nvidia-smi report.
    return _nvml_uuid_at(str(cupy.cuda.Device(index).pci_bus_id))


def _nvml_uuid_at(pci_bus_id: str) -> str:
    try:
        import pynvml
    except ImportError as exc:
        raise MissingExtraError("CUDA device identification through cupy", "cuda",
                                "nvidia-ml-py") from exc
    pynvml.nvmlInit()
    try:
        handle = pynvml.nvmlDeviceGetHandleByPciBusId(pci_bus_id.encode())
        raw = pynvml.nvmlDeviceGetUUID(handle)
    finally:
        pynvml.nvmlShutdown()
    return _format_uuid(raw.decode() if isinstance(raw, bytes) else raw)


@functools.cache
def _uuid_table(kind: str) -> dict[str, int]:
    if kind == "torch":
        count = torch_module("CUDA device identification").cuda.device_count()
    else:
        count = cupy_module("CUDA device identification").cuda.runtime.getDeviceCount()
    return {uuid_of(kind, i): i for i in range(count)}


def local_index_of(kind: str, device_uuid: str) -> int:
    """This process's index of the GPU called `device_uuid` (TransportError if unseen)."""
    table = _uuid_table(kind)
    if device_uuid not in table:
        raise TransportError(f"expected GPU {device_uuid} to be visible to this process, "
                             f"but it sees only {sorted(table)} (check CUDA_VISIBLE_DEVICES)")
    return table[device_uuid]


@functools.cache
def _libcuda() -> ctypes.CDLL:
    try:
        return ctypes.CDLL("libcuda.so.1")
    except OSError as exc:
        raise TransportError(f"expected the CUDA driver library libcuda.so.1, got {exc}"
                             ) from exc


def allocation_range(ptr: int) -> tuple[int, int]:
    """Base address and size of the CUDA allocation containing device pointer `ptr`.

    IPC handles name whole allocations (cudaMalloc blocks); pooled allocators (cupy's)
    hand out pieces of them, so the receiver needs the piece's offset in its block.
    """
    base = ctypes.c_uint64()
    size = ctypes.c_size_t()
    lib = _libcuda()
    fn = lib.cuMemGetAddressRange_v2
    fn.argtypes = [ctypes.POINTER(ctypes.c_uint64), ctypes.POINTER(ctypes.c_size_t),
                   ctypes.c_uint64]
    status = fn(ctypes.byref(base), ctypes.byref(size), ctypes.c_uint64(ptr))
    if status != 0:
        raise TransportError(f"expected cuMemGetAddressRange to succeed for 0x{ptr:x}, "
                             f"got CUDA error {status}")
    return int(base.value), int(size.value)
