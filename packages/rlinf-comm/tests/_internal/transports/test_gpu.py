"""Device identification in `gpu.py`, with cupy and NVML replaced by stand-ins (no GPU)."""

from __future__ import annotations

import sys
import types

import pytest

from rlinf.comm._internal.transports import gpu

UUID = "GPU-bcc39b26-56fc-81ed-dc38-a949b192f0bb"
RAW = bytes.fromhex(UUID[4:].replace("-", ""))


def _fake_cupy(uuid: object) -> types.ModuleType:
    cupy = types.ModuleType("cupy")
    cupy.cuda = types.SimpleNamespace(  # type: ignore[attr-defined]
        runtime=types.SimpleNamespace(getDeviceProperties=lambda index: {"uuid": uuid}),
        Device=lambda index: types.SimpleNamespace(pci_bus_id="0000:3B:00.0"))
    return cupy


def _fake_nvml(calls: list[str]) -> types.ModuleType:
    nvml = types.ModuleType("pynvml")
    nvml.nvmlInit = lambda: calls.append("init")  # type: ignore[attr-defined]
    nvml.nvmlShutdown = lambda: calls.append("shutdown")  # type: ignore[attr-defined]
    nvml.nvmlDeviceGetHandleByPciBusId = (  # type: ignore[attr-defined]
        lambda bus: calls.append(bus.decode()) or "handle")
    nvml.nvmlDeviceGetUUID = lambda handle: UUID  # type: ignore[attr-defined]
    return nvml


def test_cupy_uuid_of_sixteen_bytes_is_formatted(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "cupy", _fake_cupy(RAW))
    assert gpu.uuid_of("cupy", 0) == UUID


def test_cupy_uuid_cut_short_is_asked_of_nvml_by_pci_bus_id(
        monkeypatch: pytest.MonkeyPatch) -> None:
    calls: list[str] = []
    monkeypatch.setitem(sys.modules, "cupy", _fake_cupy(RAW[:5]))
    monkeypatch.setitem(sys.modules, "pynvml", _fake_nvml(calls))
    assert gpu.uuid_of("cupy", 0) == UUID
    assert calls == ["init", "0000:3B:00.0", "shutdown"]


def test_cupy_uuid_cut_short_without_nvml_names_the_extra(
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "cupy", _fake_cupy(RAW[:5]))
    monkeypatch.setitem(sys.modules, "pynvml", None)  # import raises ImportError
    with pytest.raises(gpu.MissingExtraError, match="nvidia-ml-py"):
        gpu.uuid_of("cupy", 0)
