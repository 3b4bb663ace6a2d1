"""Profiler: measure components, store profiles as JSON, fit cost curves for the planner.

Workers wrap each step::

    profiler = Profiler()
    with profiler.measure("rollout", batch_size=64, num_devices=2):
        generate(...)
    profiler.save("profiles/rollout.json")

Each measurement records wall time and peak memory: the CUDA allocator's peak when torch is
already imported and CUDA is available, else the process's peak resident set (on Linux the
peak is reset at the start of the block through ``/proc/self/clear_refs``; elsewhere it is
the process's lifetime peak). Peaks are per process: measure one block at a time per process.

Context-switch times come from the device lock (`record_switch`). `fit_profile` turns a
profile into a `FittedCostModel` (the `rlinf.sched.costs.CostModel` the planner consumes)::

    time(batch, devices)   = a + b · batch/devices + c · batch          (seconds)
    memory(batch, devices) = m0 + m1 · batch/devices                    (bytes per device)

fitted by least squares, with coefficient standard errors and the residual standard deviation
as error bars (`CostCurve.predict` returns mean and standard deviation).
"""

from __future__ import annotations

import contextlib
import json
import math
import os
import resource
import sys
import threading
import time
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import structlog

from rlinf.sched._files import read_int, read_number
from rlinf.sched.errors import ProfileError

__all__ = [
    "CostCurve",
    "FittedCostModel",
    "Measurement",
    "Profile",
    "Profiler",
    "fit_curve",
    "fit_profile",
]

_log = structlog.get_logger(__name__)

PROFILE_FORMAT = "rlinf-profile/1"

TIME_FEATURES = ("batch_per_device", "const", "batch")
"""Seconds of a call: parallel (items per device), fixed, and serial (items) parts. Ordered
by what a fit keeps when its points cannot separate them (`fit_curve`): measured at one
batch and device count only, a component is assumed to scale with its items per device."""
MEMORY_FEATURES = ("const", "batch_per_device")


@dataclass(frozen=True)
class Measurement:
    """One measured call of a component."""

    component: str
    batch_size: int
    """Samples processed by the call, in total."""
    num_devices: int
    """Devices the call was spread over."""
    seconds: float
    """Wall-clock time."""
    peak_memory_bytes: int
    """Peak memory during the call (CUDA allocator peak, or process resident-set peak)."""
    memory_source: str = "rss"
    """Where the peak came from: ``"cuda"``, ``"rss"`` or ``"none"``."""
    timestamp: float = 0.0
    """Unix time the call started."""

    def __post_init__(self) -> None:
        if not self.component:
            raise ProfileError("measurement without a component name: expected a name")
        if self.batch_size < 1 or self.num_devices < 1:
            raise ProfileError(
                f"measurement of {self.component!r} with batch_size={self.batch_size}, "
                f"num_devices={self.num_devices}: expected both >= 1"
            )
        if not math.isfinite(self.seconds) or self.seconds < 0:
            raise ProfileError(
                f"measurement of {self.component!r} took {self.seconds!r} s: expected a "
                "finite non-negative time"
            )


@dataclass(frozen=True)
class SwitchRecord:
    """One context switch: `component` offloaded (``"offload"``) or onloaded (``"onload"``)."""

    component: str
    direction: str
    seconds: float
    device: int = -1
    timestamp: float = 0.0


@dataclass(frozen=True)
class Profile:
    """Measurements and switch records; stored as a JSON file (``rlinf-profile/1``)."""

    measurements: tuple[Measurement, ...] = ()
    switches: tuple[SwitchRecord, ...] = ()
    metadata: Mapping[str, Any] = field(default_factory=dict)

    @property
    def components(self) -> tuple[str, ...]:
        """Components with measurements or switch records, in first-seen order."""
        names = [m.component for m in self.measurements] + [s.component for s in self.switches]
        return tuple(dict.fromkeys(names))

    def of(self, component: str) -> tuple[Measurement, ...]:
        """Measurements of one component."""
        return tuple(m for m in self.measurements if m.component == component)

    def merge(self, *others: Profile) -> Profile:
        """This profile plus others (e.g. one file per worker)."""
        meas = list(self.measurements)
        sw = list(self.switches)
        meta = dict(self.metadata)
        for other in others:
            meas.extend(other.measurements)
            sw.extend(other.switches)
            meta.update(other.metadata)
        return Profile(tuple(meas), tuple(sw), meta)

    def to_dict(self) -> dict[str, Any]:
        """The JSON document `save` writes."""
        return {
            "format": PROFILE_FORMAT,
            "metadata": dict(self.metadata),
            "measurements": [asdict(m) for m in self.measurements],
            "switches": [asdict(s) for s in self.switches],
        }

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> Profile:
        """Read a document written by `to_dict`."""
        if not isinstance(data, Mapping) or data.get("format") != PROFILE_FORMAT:
            found = data.get("format") if isinstance(data, Mapping) else type(data).__name__
            raise ProfileError(
                f"not a profile document (format {found!r}): expected format {PROFILE_FORMAT!r}"
            )
        try:
            meas = tuple(Measurement(**_checked(m, f"measurements[{i}]", _MEASUREMENT_NUMBERS))
                         for i, m in enumerate(_entries(data, "measurements")))
            sw = tuple(SwitchRecord(**_checked(s, f"switches[{i}]", _SWITCH_NUMBERS))
                       for i, s in enumerate(_entries(data, "switches")))
        except TypeError as exc:
            raise ProfileError(f"malformed profile entry: {exc}") from exc
        return cls(meas, sw, dict(data.get("metadata", {})))

    def save(self, path: str | os.PathLike[str]) -> None:
        """Write the profile as JSON (atomically: a reader never sees half a file)."""
        p = Path(path)
        p.parent.mkdir(parents=True, exist_ok=True)
        tmp = p.with_name(f".{p.name}.{os.getpid()}.tmp")
        tmp.write_text(json.dumps(self.to_dict(), indent=1) + "\n")
        tmp.replace(p)

    @classmethod
    def load(cls, *paths: str | os.PathLike[str]) -> Profile:
        """Read one or more profile files (or directories of ``*.json``) and merge them."""
        files: list[Path] = []
        for path in paths:
            p = Path(path)
            files.extend(sorted(p.glob("*.json")) if p.is_dir() else [p])
        if not files:
            raise ProfileError(f"no profile files in {[str(p) for p in paths]}")
        profiles = []
        for f in files:
            try:
                data = json.loads(f.read_text())
            except (OSError, json.JSONDecodeError) as exc:
                raise ProfileError(f"cannot read profile {str(f)!r}: {exc}") from exc
            try:
                profiles.append(cls.from_dict(data))
            except ProfileError as exc:
                raise ProfileError(f"in profile {str(f)!r}: {exc}") from exc
        return profiles[0].merge(*profiles[1:])


# The numeric fields of a profile document: the least integer, or None for a float >= 0.
_MEASUREMENT_NUMBERS: Mapping[str, int | None] = {
    "batch_size": 1, "num_devices": 1, "peak_memory_bytes": 0, "seconds": None,
    "timestamp": None,
}
_SWITCH_NUMBERS: Mapping[str, int | None] = {"device": -1, "seconds": None, "timestamp": None}


def _entries(data: Mapping[str, Any], key: str) -> list[Any]:
    value = data.get(key, [])
    if not isinstance(value, list):
        raise ProfileError(f"{key} is {type(value).__name__}: expected a list")
    return value


def _checked(entry: Any, where: str, numbers: Mapping[str, int | None]) -> dict[str, Any]:
    """`entry` with its numeric fields checked (ProfileError names `where`.key)."""
    if not isinstance(entry, Mapping):
        raise ProfileError(f"{where} is {entry!r}: expected a mapping")
    out = dict(entry)
    for key, minimum in numbers.items():
        if key in out:
            out[key] = (read_number(out[key], f"{where}.{key}", error=ProfileError)
                        if minimum is None else
                        read_int(out[key], f"{where}.{key}", error=ProfileError, minimum=minimum))
    return out


# --------------------------------------------------------------------------------------------
# Memory probes


class _PeakProbe:
    """Reset-then-read peak memory of this process (CUDA allocator or resident set)."""

    def __init__(self, *, device: int | None) -> None:
        self.device = device
        torch = sys.modules.get("torch")  # only if the worker already uses torch
        self.cuda: Any = None
        if torch is not None:
            with contextlib.suppress(Exception):
                if torch.cuda.is_available():
                    self.cuda = torch.cuda
        self.source = "cuda" if self.cuda is not None else "rss"

    def start(self) -> None:
        if self.cuda is not None:
            self.cuda.reset_peak_memory_stats(self.device)
            return
        with contextlib.suppress(OSError):
            Path("/proc/self/clear_refs").write_text("5")  # resets VmHWM (Linux >= 4.0)

    def peak(self) -> int:
        if self.cuda is not None:
            return int(self.cuda.max_memory_allocated(self.device))
        with contextlib.suppress(OSError, ValueError):
            for line in Path("/proc/self/status").read_text().splitlines():
                if line.startswith("VmHWM:"):
                    return int(line.split()[1]) * 1024
        scale = 1 if sys.platform == "darwin" else 1024  # ru_maxrss: bytes on macOS, KiB else
        return int(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss) * scale


class Profiler:
    """Collects measurements in one process; thread-safe; `save` writes them as a profile.

    Args:
        track_memory: record peak memory (costs a /proc write and read per block).
        cuda_device: the CUDA device whose allocator peak to read (default: current).
        metadata: stored in the profile (e.g. model name, cluster).
    """

    def __init__(
        self,
        *,
        track_memory: bool = True,
        cuda_device: int | None = None,
        metadata: Mapping[str, Any] | None = None,
    ) -> None:
        self._track_memory = track_memory
        self._cuda_device = cuda_device
        self._metadata = dict(metadata or {})
        self._measurements: list[Measurement] = []
        self._switches: list[SwitchRecord] = []
        self._lock = threading.Lock()

    @contextlib.contextmanager
    def measure(self, component: str, *, batch_size: int, num_devices: int) -> Iterator[None]:
        """Time the block and record its peak memory as one `Measurement`.

        Nothing is recorded if the block raises.
        """
        probe = _PeakProbe(device=self._cuda_device) if self._track_memory else None
        if probe is not None:
            probe.start()
        started = time.time()
        t0 = time.perf_counter()
        yield
        seconds = time.perf_counter() - t0
        peak = probe.peak() if probe is not None else 0
        self.record(Measurement(
            component, batch_size, num_devices, seconds, peak,
            probe.source if probe is not None else "none", started,
        ))

    def record(self, measurement: Measurement) -> None:
        """Add a measurement taken elsewhere."""
        with self._lock:
            self._measurements.append(measurement)
        _log.debug(
            "profile_measurement", component=measurement.component,
            batch_size=measurement.batch_size, num_devices=measurement.num_devices,
            seconds=round(measurement.seconds, 6), peak_bytes=measurement.peak_memory_bytes,
        )

    def record_switch(
        self, component: str, direction: str, seconds: float, *, device: int = -1
    ) -> None:
        """Record an onload or offload (the device lock calls this)."""
        if direction not in ("onload", "offload"):
            raise ProfileError(f"switch direction {direction!r}: expected 'onload' or 'offload'")
        with self._lock:
            self._switches.append(SwitchRecord(component, direction, seconds, device, time.time()))

    @property
    def profile(self) -> Profile:
        """A snapshot of everything recorded so far."""
        with self._lock:
            return Profile(tuple(self._measurements), tuple(self._switches), self._metadata)

    def save(self, path: str | os.PathLike[str]) -> Profile:
        """Write the snapshot to `path` (JSON) and return it."""
        snapshot = self.profile
        snapshot.save(path)
        return snapshot


# --------------------------------------------------------------------------------------------
# Fitting


@dataclass(frozen=True)
class CostCurve:
    """A linear model y = Σ coef_i · feature_i(batch, devices), with error bars."""

    features: tuple[str, ...]
    coefficients: tuple[float, ...]
    stderr: tuple[float, ...]
    """Standard error of each coefficient (NaN when the fit has no spare degrees of freedom)."""
    residual_std: float
    """Standard deviation of the residuals (0 with an exact fit)."""
    num_points: int

    def predict(self, *, batch_size: int, num_devices: int) -> tuple[float, float]:
        """Predicted mean and its standard deviation (residual noise plus coefficient error)."""
        x = _features(self.features, batch_size, num_devices)
        mean = float(np.dot(x, self.coefficients))
        var_coef = float(np.sum((x * np.nan_to_num(np.asarray(self.stderr))) ** 2))
        return mean, math.sqrt(self.residual_std**2 + var_coef)

    def __call__(self, *, batch_size: int, num_devices: int) -> float:
        return self.predict(batch_size=batch_size, num_devices=num_devices)[0]


def _features(names: Sequence[str], batch: float, devices: float) -> np.ndarray:
    table = {"const": 1.0, "batch_per_device": batch / devices, "batch": float(batch)}
    return np.array([table[n] for n in names])


def fit_curve(
    points: Iterable[tuple[int, int, float]], *, features: Sequence[str] = TIME_FEATURES
) -> CostCurve:
    """Least-squares fit of y over (batch_size, num_devices, y) points.

    Repeated measurements of one (batch_size, num_devices) point count as their median:
    timing noise on a shared machine is one-sided and heavy-tailed (one of three identical
    reasoning profiles timed a rollout call far above the other two), and a
    least-squares fit would take a third of such an outlier into the curve.

    Features the data cannot separate are dropped from the end of `features` (e.g. with one
    device count, ``batch`` and ``batch_per_device`` are collinear: only ``batch_per_device``
    is kept); their coefficients are 0.
    """
    repeats: dict[tuple[int, int], list[float]] = {}
    for batch_size, num_devices, value in points:
        repeats.setdefault((batch_size, num_devices), []).append(value)
    pts = [(b, n, float(np.median(ys))) for (b, n), ys in repeats.items()]
    if not pts:
        raise ProfileError("no points to fit: expected at least one measurement")
    names = list(features)
    unknown = [n for n in names if n not in ("const", "batch_per_device", "batch")]
    if unknown:
        raise ProfileError(f"unknown feature(s) {unknown}: expected const, batch_per_device, batch")
    y = np.array([p[2] for p in pts], dtype=float)
    full = np.array([_features(names, p[0], p[1]) for p in pts])
    keep: list[int] = []
    for j in range(len(names)):  # greedy: keep a column only if it adds rank
        trial = [*keep, j]
        if np.linalg.matrix_rank(full[:, trial]) == len(trial):
            keep.append(j)
    x = full[:, keep]
    coef, *_ = np.linalg.lstsq(x, y, rcond=None)
    resid = y - x @ coef
    dof = len(pts) - len(keep)
    sigma2 = float(resid @ resid / dof) if dof > 0 else 0.0
    if dof > 0:
        cov = sigma2 * np.linalg.inv(x.T @ x)
        se_kept = np.sqrt(np.clip(np.diag(cov), 0.0, None))
    else:
        se_kept = np.full(len(keep), np.nan)
    coefficients = [0.0] * len(names)
    stderr = [0.0] * len(names)
    for k, j in enumerate(keep):
        coefficients[j] = float(coef[k])
        stderr[j] = float(se_kept[k])
    return CostCurve(tuple(names), tuple(coefficients), tuple(stderr), math.sqrt(sigma2), len(pts))


@dataclass(frozen=True)
class FittedCostModel:
    """`CostModel` from measured profiles: per-component time and memory curves."""

    time_curves: Mapping[str, CostCurve]
    memory_curves: Mapping[str, CostCurve]
    switch_seconds: Mapping[str, float]
    """Mean offload + onload seconds per component (0 if never switched)."""

    def _curve(self, table: Mapping[str, CostCurve], component: str) -> CostCurve:
        try:
            return table[component]
        except KeyError:
            raise ProfileError(
                f"no profile for component {component!r}: expected one of {sorted(table)}"
            ) from None

    def time(self, component: str, *, batch_size: int, num_devices: int) -> float:
        """Predicted seconds (clamped at 0)."""
        curve = self._curve(self.time_curves, component)
        return max(0.0, curve(batch_size=batch_size, num_devices=num_devices))

    def memory(self, component: str, *, batch_size: int, num_devices: int) -> int:
        """Predicted peak bytes per device (clamped at 0)."""
        curve = self._curve(self.memory_curves, component)
        return max(0, round(curve(batch_size=batch_size, num_devices=num_devices)))

    def switch_time(self, component: str) -> float:
        """Mean measured offload + onload seconds; 0 for a component never switched."""
        return self.switch_seconds.get(component, 0.0)

    def time_interval(
        self, component: str, *, batch_size: int, num_devices: int
    ) -> tuple[float, float]:
        """Predicted seconds and the standard deviation of that prediction."""
        curve = self._curve(self.time_curves, component)
        return curve.predict(batch_size=batch_size, num_devices=num_devices)


def fit_profile(profile: Profile) -> FittedCostModel:
    """Fit time and memory curves for every measured component of `profile`."""
    times: dict[str, CostCurve] = {}
    mems: dict[str, CostCurve] = {}
    for comp in dict.fromkeys(m.component for m in profile.measurements):
        ms = profile.of(comp)
        times[comp] = fit_curve(
            ((m.batch_size, m.num_devices, m.seconds) for m in ms), features=TIME_FEATURES
        )
        mem_pts = [(m.batch_size, m.num_devices, float(m.peak_memory_bytes)) for m in ms
                   if m.memory_source != "none"]
        if mem_pts:
            mems[comp] = fit_curve(mem_pts, features=MEMORY_FEATURES)
    switch: dict[str, float] = {}
    for comp in dict.fromkeys(s.component for s in profile.switches):
        for direction in ("offload", "onload"):
            secs = [s.seconds for s in profile.switches
                    if s.component == comp and s.direction == direction]
            if secs:
                switch[comp] = switch.get(comp, 0.0) + float(np.mean(secs))
    if not times and not switch:
        raise ProfileError("the profile has no measurements: expected at least one")
    return FittedCostModel(times, mems, switch)
