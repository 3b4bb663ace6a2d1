"""A sandboxed Python interpreter for tool calls: each call runs in a fresh process.

The child (`_sandbox_child`) starts isolated (``python -I``, a minimal environment, its own
session, the scratch folder as its working directory), lowers its limits (CPU seconds,
address space, file size, open files, no core dumps), installs an audit hook and runs the
code. The hook refuses files outside the scratch folder (reading the interpreter's own
library excepted), sockets, new processes, signals and ctypes. The parent enforces the wall
time and the output size, and kills the whole process group when a call ends, so nothing a
call started outlives it.

A call that breaks a limit comes back as a `ToolResult` with ``ok=False`` and an ``error``
saying which limit, never as an exception or a hang of the caller. The audit hook is a
policy for model-written code, not a boundary against code built to escape CPython; run
untrusted workloads in a container or VM as well.
"""

from __future__ import annotations

import contextlib
import os
import selectors
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

from rlinf.envs.errors import ConfigError

__all__ = ["SandboxLimits", "ToolResult", "run_python"]

_CHILD = (Path(__file__).with_name("_sandbox_child.py")).read_text(encoding="utf-8")
_CODE_FILE = "_tool_call.py"


@dataclass(frozen=True)
class SandboxLimits:
    """What one call may use."""

    cpu_seconds: float = 5.0
    """CPU time (RLIMIT_CPU: the kernel stops the process past it)."""
    wall_seconds: float = 10.0
    """Elapsed time before the parent kills the call."""
    memory_bytes: int = 512 << 20
    """Address space (RLIMIT_AS): a larger allocation raises MemoryError in the call."""
    output_bytes: int = 64 << 10
    """stdout and stderr together; past it the call is killed and its output cut."""
    file_bytes: int = 16 << 20
    """Largest file the call may write in its scratch folder (RLIMIT_FSIZE)."""

    def __post_init__(self) -> None:
        if min(self.cpu_seconds, self.wall_seconds) <= 0 or min(
                self.memory_bytes, self.output_bytes, self.file_bytes) <= 0:
            raise ConfigError(f"sandbox limits must be > 0, got {self}")


@dataclass(frozen=True)
class ToolResult:
    """What a tool call gives back: the observation the model sees next."""

    ok: bool
    """The call finished within its limits without an exception."""
    output: str
    """Its stdout and stderr (cut at the output limit)."""
    error: str | None
    """Which limit it broke, or its exception's last line (None when ok)."""
    seconds: float
    """Wall time of the call."""

    @property
    def observation(self) -> str:
        """The text appended to the conversation: the output, then the error if any."""
        return self.output if self.ok else f"{self.output}\n[error] {self.error}".lstrip()


def run_python(code: str, *, limits: SandboxLimits = SandboxLimits(),
               scratch: str | Path | None = None) -> ToolResult:
    """Run `code` in a fresh sandboxed interpreter (module docstring); `scratch` is its only
    writable folder (None: a temporary one, removed after the call)."""
    started = time.perf_counter()
    owned = scratch is None
    folder = Path(tempfile.mkdtemp(prefix="rlinf-tool-") if scratch is None else scratch)
    folder.mkdir(parents=True, exist_ok=True)
    try:
        (folder / _CODE_FILE).write_text(code, encoding="utf-8")
        env = {"PATH": "/usr/bin:/bin", "HOME": str(folder), "LANG": "C.UTF-8",
               "OMP_NUM_THREADS": "1", "PYTHONDONTWRITEBYTECODE": "1"}
        proc = subprocess.Popen(
            [sys.executable, "-I", "-c", _CHILD, str(folder), str(folder / _CODE_FILE),
             str(limits.cpu_seconds), str(limits.memory_bytes), str(limits.file_bytes)],
            stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
            cwd=folder, env=env, start_new_session=True)
        output, broke = _collect(proc, limits, started)
        if broke is None:  # its output ended: give it the time left to exit
            try:
                proc.wait(timeout=max(limits.wall_seconds - (time.perf_counter() - started),
                                      0.01))
            except subprocess.TimeoutExpired:
                broke = f"wall time limit ({limits.wall_seconds:g} s) exceeded"
        _kill_group(proc)  # its leader not yet reaped, the group id is still its own
        status = proc.returncode
    finally:
        if owned:
            shutil.rmtree(folder, ignore_errors=True)
    text = output.decode("utf-8", errors="replace")
    seconds = time.perf_counter() - started
    if broke is not None:
        return ToolResult(False, text, broke, seconds)
    if status in (-signal.SIGXCPU, -signal.SIGKILL):
        return ToolResult(False, text, f"CPU time limit ({limits.cpu_seconds:g} s) exceeded",
                          seconds)
    if status != 0:
        lines = [line for line in text.strip().splitlines() if line.strip()]
        last = lines[-1] if lines else f"exit status {status}"
        return ToolResult(False, text, last, seconds)
    return ToolResult(True, text, None, seconds)


def _collect(proc: subprocess.Popen[bytes], limits: SandboxLimits,
             started: float) -> tuple[bytes, str | None]:
    """The call's output, and which limit (wall time, output) it broke, if any."""
    assert proc.stdout is not None
    chunks: list[bytes] = []
    size = 0
    with selectors.DefaultSelector() as selector:
        selector.register(proc.stdout, selectors.EVENT_READ)
        while True:
            left = limits.wall_seconds - (time.perf_counter() - started)
            if left <= 0:
                _kill_group(proc)
                return b"".join(chunks), (f"wall time limit ({limits.wall_seconds:g} s) "
                                          "exceeded")
            if not selector.select(timeout=min(left, 0.5)):
                continue
            chunk = os.read(proc.stdout.fileno(), 65536)
            if not chunk:
                return b"".join(chunks), None
            size += len(chunk)
            if size > limits.output_bytes:
                chunks.append(chunk[:max(limits.output_bytes - (size - len(chunk)), 0)])
                _kill_group(proc)
                return b"".join(chunks), (f"output limit ({limits.output_bytes} bytes) "
                                          "exceeded; the output was cut")
            chunks.append(chunk)


def _kill_group(proc: subprocess.Popen[bytes]) -> None:
    """Kill the call's process group (it is its session's leader) and reap it."""
    if proc.returncode is None:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(proc.pid, signal.SIGKILL)
    with contextlib.suppress(subprocess.TimeoutExpired):
        proc.wait(timeout=5)
    if proc.stdout is not None:
        proc.stdout.close()
