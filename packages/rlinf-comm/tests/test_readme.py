"""The README's examples run exactly as written: each ``<!-- file: NAME -->`` block is
saved under its name and run in its own process, the way the README says to run it."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

README = Path(__file__).resolve().parents[1] / "README.md"
_BLOCK = re.compile(r"<!-- file: (\S+) -->\n```python\n(.*?)```", re.DOTALL)
# The README's token command, run as the README's shell would run it.
_MAKE_TOKEN = re.compile(r"RLINF_COMM_TOKEN=\$\(python -c \"(.*?)\"\)")


@pytest.fixture
def examples(tmp_path: Path) -> Path:
    text = README.read_text()
    for name, code in _BLOCK.findall(text):
        (tmp_path / name).write_text(code)
    assert {p.name for p in tmp_path.iterdir()} >= {"receiver.py", "sender.py",
                                                    "channel_demo.py"}
    return tmp_path


def _env_with_readme_token() -> dict[str, str]:
    command = _MAKE_TOKEN.search(README.read_text())
    assert command is not None, "the README shows how to make a token"
    token = subprocess.run([sys.executable, "-c", command.group(1)], check=True,
                           capture_output=True, text=True, timeout=60).stdout.strip()
    return {**os.environ, "RLINF_COMM_TOKEN": token}


def test_the_two_process_example(examples: Path) -> None:
    env = _env_with_readme_token()
    receiver = subprocess.Popen([sys.executable, "receiver.py"], cwd=examples, env=env,
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        assert receiver.stdout is not None
        address = receiver.stdout.readline().strip()
        assert re.fullmatch(r"127\.0\.0\.1:\d+", address), address
        sender = subprocess.run([sys.executable, "sender.py", address], cwd=examples, env=env,
                                check=False, capture_output=True, text=True, timeout=120)
        assert sender.returncode == 0, sender.stderr
        out, err = receiver.communicate(timeout=120)
        assert receiver.returncode == 0, err
        assert out.splitlines() == ["ndarray (256, 84, 84) float32 7", "reward 256.0 obs mean 0.5"]
    finally:
        receiver.kill()


def test_the_channel_example(examples: Path) -> None:
    env = {k: v for k, v in os.environ.items() if k != "RLINF_COMM_TOKEN"}  # passed explicitly
    done = subprocess.run([sys.executable, "channel_demo.py"], cwd=examples, env=env,
                          check=False, capture_output=True, text=True, timeout=180)
    assert done.returncode == 0, done.stderr
    assert done.stdout.splitlines() == ["sequences 64"]
