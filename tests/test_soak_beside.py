"""`scripts/soak_beside.py`, which runs CI's soak beside other test commands: `wait` reports
the background command's output and exit code, and a command whose env failed (`stop`) or
whose starter is gone (tox interrupted) is killed, not left running."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

SCRIPT = Path(__file__).resolve().parents[1] / "scripts" / "soak_beside.py"


def _script(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, str(SCRIPT), *args], check=False,
                          capture_output=True, text=True, timeout=120)


def _sleeper(pid_file: Path) -> list[str]:
    """A command that records its pid and sleeps a minute."""
    return [sys.executable, "-c",
            f"import os, time; open({str(pid_file)!r}, 'w').write(str(os.getpid())); "
            "time.sleep(60)"]


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return Path(f"/proc/{pid}/stat").read_text().split()[2] != "Z"


def _pid_of(pid_file: Path) -> int:
    deadline = time.monotonic() + 30
    while not (pid_file.exists() and pid_file.read_text()):
        assert time.monotonic() < deadline, "the background command never started"
        time.sleep(0.05)
    return int(pid_file.read_text())


def _gone_within(pid: int, seconds: float) -> bool:
    deadline = time.monotonic() + seconds
    while _alive(pid):
        if time.monotonic() > deadline:
            return False
        time.sleep(0.1)
    return True


def test_wait_reports_the_background_commands_output_and_exit_code(tmp_path: Path) -> None:
    started = _script("start", str(tmp_path), "--", sys.executable, "-c",
                      "print('soaked'); raise SystemExit(3)")
    assert started.returncode == 0, started.stderr
    waited = _script("wait", str(tmp_path))
    assert waited.returncode == 3
    assert "soaked" in waited.stdout and "exit code 3" in waited.stdout
    assert _script("stop", str(tmp_path)).returncode == 0  # after wait: nothing to stop


def test_stop_kills_a_command_still_running(tmp_path: Path) -> None:
    assert _script("start", str(tmp_path), "--", *_sleeper(tmp_path / "pid")).returncode == 0
    pid = _pid_of(tmp_path / "pid")
    assert _script("stop", str(tmp_path)).returncode == 0
    assert _gone_within(pid, 10.0)
    assert (tmp_path / "soak.rc").exists()


def test_the_command_dies_with_its_starter(tmp_path: Path) -> None:
    """The process that ran ``start`` (tox) exits without ``wait`` or ``stop``."""
    starter = (f"import subprocess, sys; subprocess.run([sys.executable, {str(SCRIPT)!r}, "
               f"'start', {str(tmp_path)!r}, '--', *{_sleeper(tmp_path / 'pid')!r}])")
    subprocess.run([sys.executable, "-c", starter], check=True, timeout=60)
    rc = tmp_path / "soak.rc"
    deadline = time.monotonic() + 30
    while not rc.exists():  # the supervisor records how the command ended
        assert time.monotonic() < deadline, "the command outlived its starter"
        time.sleep(0.1)
    assert int(rc.read_text()) < 0  # killed by a signal, not ended by itself
    pid_file = tmp_path / "pid"
    if pid_file.exists() and pid_file.read_text():  # killed after it had started
        assert _gone_within(int(pid_file.read_text()), 10.0)


def test_wait_without_start_says_what_to_do(tmp_path: Path) -> None:
    waited = _script("wait", str(tmp_path))
    assert waited.returncode == 2 and "run 'start' first" in waited.stderr
