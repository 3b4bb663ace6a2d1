"""Hybrid placement end to end (env and rollout pipelined in two processes), with the Chrome
trace of every worker beside the planner's predicted Gantt."""

from __future__ import annotations

import json

from PIL import Image

from .conftest import TINY, check_outputs, run_cli, summary_of


def test_hybrid_run_with_trace(tmp_path, ray_address):
    run_dir = tmp_path / "run"
    proc = run_cli([*TINY, "placement=hybrid", "run.trace=true", "run.video=false",
                    "--run-dir", str(run_dir)], ray_address=ray_address)
    assert proc.returncode == 0, proc.stderr
    check_outputs(run_dir, iterations=2, video=False)
    summary = summary_of(run_dir)
    assert summary["mode"] == "hybrid"
    assert summary["placement"] == "env: 0, rollout: 1, actor: 0-1"
    # the fixed plan was priced from what the run measured of itself
    assert summary["predicted_iteration_s"] > 0
    assert "predict: " in proc.stdout and "priced from the components this run measured" \
        in proc.stdout
    trace = json.loads((run_dir / "trace.json").read_text())
    events = trace["traceEvents"]
    processes = {e["args"]["name"] for e in events if e.get("name") == "process_name"}
    assert processes == {"measured", "predicted"}
    threads = {e["args"]["name"] for e in events if e.get("name") == "thread_name"}
    assert {"env/0", "rollout/0", "actor/0"} <= threads, threads
    spans = [e for e in events if e.get("ph") == "X"]
    assert any(s["name"] == "env_step" for s in spans)
    assert all(s["dur"] >= 0 for s in spans)
    with Image.open(run_dir / "timeline.png") as png:
        assert png.format == "PNG"
