"""The sandboxed interpreter: ordinary code runs; every way out of a call's limits comes back
as an error observation within its limit, and the caller goes on."""

from __future__ import annotations

import os
import socket
import time
from pathlib import Path

import pytest

from rlinf.envs.tools import SandboxLimits, run_python

LIMITS = SandboxLimits(cpu_seconds=2, wall_seconds=6, memory_bytes=512 << 20,
                       output_bytes=16 << 10)


def test_ordinary_code_runs_and_may_use_its_scratch_folder(tmp_path: Path) -> None:
    result = run_python("import math, json\n"
                        "open('notes.txt', 'w').write('7')\n"
                        "print(math.factorial(5), json.dumps({'a': 1}), open('notes.txt').read())",
                        limits=LIMITS, scratch=tmp_path)
    assert result.ok, result.error
    assert result.output.split() == ["120", '{"a":', "1}", "7"]
    assert (tmp_path / "notes.txt").read_text() == "7"
    assert result.observation == result.output


def test_an_exception_is_its_last_line() -> None:
    result = run_python("x = 1 / 0", limits=LIMITS)
    assert not result.ok and result.error == "ZeroDivisionError: division by zero"
    assert "[error] ZeroDivisionError" in result.observation


# (code, what the error says, the limit it must come back within, in seconds)
ESCAPES = {
    "infinite loop": ("while True:\n    pass\n", "CPU time limit", LIMITS.wall_seconds),
    "fork bomb": ("import os\nwhile True:\n    os.fork()\n", "os.fork is not allowed",
                  LIMITS.wall_seconds),
    "subprocess": ("import subprocess\nsubprocess.run(['ls', '/'])\n",
                   "is not allowed", LIMITS.wall_seconds),
    "1 GB allocation": ("x = bytearray(1 << 30)\n", "MemoryError", LIMITS.wall_seconds),
    "read /etc/passwd": ("print(open('/etc/passwd').read())\n",
                         "no access to '/etc/passwd'", LIMITS.wall_seconds),
    "socket": ("import socket\nsocket.create_connection(('example.com', 80))\n",
               "is not allowed", LIMITS.wall_seconds),
    "write outside scratch": ("open('/tmp/rlinf-escaped.txt', 'w').write('x')\n",
                              "outside the scratch folder", LIMITS.wall_seconds),
    "100 MB print": ("print('x' * 100_000_000)\n", "output limit", LIMITS.wall_seconds),
    "ctypes": ("import ctypes\nctypes.CDLL(None).system(b'id')\n", "not allowed",
               LIMITS.wall_seconds),
    "raise its own limits": ("import resource\n", "importing resource is not allowed",
                             LIMITS.wall_seconds),
    "sleep past the wall time": ("import time\ntime.sleep(60)\n", "wall time limit",
                                 LIMITS.wall_seconds + 2),
}


@pytest.mark.parametrize("case", list(ESCAPES))
def test_a_call_that_breaks_a_limit_is_an_error_observation(case: str) -> None:
    code, message, within = ESCAPES[case]
    started = time.monotonic()
    result = run_python(code, limits=LIMITS)
    elapsed = time.monotonic() - started
    assert not result.ok, result
    assert message in (result.error or ""), result
    assert elapsed < within + 3, elapsed  # generous: a shared machine
    assert len(result.output.encode()) <= LIMITS.output_bytes
    assert not os.path.exists("/tmp/rlinf-escaped.txt")
    # the caller goes on: the next call runs normally
    assert run_python("print(6 * 7)", limits=LIMITS).output.strip() == "42"


def test_a_call_leaves_no_process_behind() -> None:
    import psutil

    before = {p.pid for p in psutil.Process().children(recursive=True)}
    run_python("while True:\n    pass\n", limits=SandboxLimits(cpu_seconds=1, wall_seconds=2))
    assert {p.pid for p in psutil.Process().children(recursive=True)} <= before


def test_no_network_even_on_localhost() -> None:
    with socket.socket() as server:
        server.bind(("127.0.0.1", 0))
        server.listen()
        port = server.getsockname()[1]
        result = run_python(f"import socket\nsocket.create_connection(('127.0.0.1', {port}))",
                            limits=LIMITS)
    assert not result.ok and "not allowed" in (result.error or "")
