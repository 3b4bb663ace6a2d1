"""The default run learns: `rlinf-embodied` with no overrides (PPO on
InvertedDoublePendulum-v5, collocated, CPU) reaches the task's threshold (evaluation return
>= 5000) within 10 minutes. Minutes long, so marked ``long``: CI's tox envs leave it out,
``tox -e test-long`` runs it."""

from __future__ import annotations

import time

import pytest

from .conftest import run_cli, summary_of


@pytest.mark.slow
@pytest.mark.long
def test_default_run_reaches_the_threshold_within_ten_minutes(tmp_path):
    run_dir = tmp_path / "run"
    started = time.monotonic()
    proc = run_cli(["--run-dir", str(run_dir), "--check-target"], ray_address=None,
                   timeout=900)
    elapsed = time.monotonic() - started
    assert proc.returncode == 0, (proc.stdout[-2000:], proc.stderr[-2000:])
    summary = summary_of(run_dir)
    assert summary["target_return"] == 5000.0
    assert summary["target_reached"] is True
    assert summary["eval_return_after"] >= 5000.0 > 10 * summary["eval_return_before"]
    assert "return >= 5000: REACHED" in proc.stdout
    assert elapsed < 600, f"the default run took {elapsed:.0f} s (start-up included)"
