"""`placement=auto` end to end: profile, plan with M2Flow, launch the best plan, report the
predicted against the measured iteration time.

Both runs plan from the profile `auto_dry_run` (conftest) measured into ``run.profile_cache``:
the test of profiling itself is that dry run's.
"""

from __future__ import annotations

import pytest

from rlinf.sched import Profile

from .conftest import TINY, check_outputs, run_cli, summary_of


def test_auto_run_launches_the_planned_placement(tmp_path, ray_address, auto_dry_run):
    cache = auto_dry_run[0]
    [stored] = cache.glob("*.json")
    measured = Profile.load(stored)
    run_dir = tmp_path / "run"
    proc = run_cli([*TINY, "placement=auto", "run.video=false", "run.trial_plans=0",
                    f"run.profile_cache={cache}", "--run-dir", str(run_dir)],
                   ray_address=ray_address, timeout=300)
    assert proc.returncode == 0, proc.stderr
    # The dry run's profile of this very config was reused, not measured again ...
    assert f"auto: priced from the profile measured before for this workflow, model and " \
           f"cluster ({stored})" in proc.stdout
    assert Profile.load(run_dir / "profile.json") == measured
    # ... and what the run measured of itself was added to it, for the next run
    assert len(Profile.load(stored).measurements) > len(measured.measurements)
    check_outputs(run_dir, iterations=2, video=False)
    summary = summary_of(run_dir)
    assert summary["mode"] in {"collocated", "hybrid", "disaggregated"}
    assert summary["trials"] == []  # run.trial_plans=0: the best-priced plan, untried
    assert summary["predicted_iteration_s"] > 0 and summary["measured_iteration_s"] > 0
    assert f"predicted iteration time: {summary['predicted_iteration_s']:.3f}" in proc.stdout
    assert "s median (predicted " in proc.stdout  # the summary puts both side by side
    # Context switches of the steady iteration (the second): the lock's onloads equal the
    # simulation's that gave the prediction (the env moves nothing, so the actor stays).
    assert isinstance(summary["simulated_switches"], int)
    assert summary["lock_switches_per_iteration"] == summary["simulated_switches"]
    assert "per iteration by the device lock" in proc.stdout
    # What the planner priced is kept beside the run, to compare with what ran.
    profile = Profile.load(run_dir / "profile.json")
    assert {"env", "rollout", "actor"} <= set(profile.components)
    # env and policy were also timed on two processes at once (measure_parallel), so the
    # fit knows what a second env worker or policy process really buys
    for component in ("env", "rollout"):
        assert {m.num_devices for m in profile.of(component)} == {1, 2}, component
    # iterations with the link (the pipelined probe) and without it (the policy inline),
    # which price the link and the devices' hand-overs
    assert profile.of("probe_iteration") and len(profile.of("collocated_iteration")) >= 2
    saved = (run_dir / "profile.json").read_bytes()

    # Resuming keeps the checkpoint's plan (its stage groups are part of the saved state):
    # no new profile, so the very same prediction, not a fresh measurement's.
    longer = run_cli([*TINY, "placement=auto", "run.video=false", "run.iterations=3",
                      "run.trial_plans=0", "--run-dir", str(run_dir), "--resume"],
                     ray_address=ray_address, timeout=300)
    assert longer.returncode == 0, longer.stderr
    assert "resuming from iteration 2" in longer.stdout
    assert f"predicted iteration time: {summary['predicted_iteration_s']:.3f}" \
        in longer.stdout
    assert summary_of(run_dir)["mode"] == summary["mode"]
    assert (run_dir / "profile.json").read_bytes() == saved  # no new profile on resume


def test_auto_launches_the_fastest_of_its_trials(tmp_path, ray_address, auto_dry_run):
    # A margin this wide shortlists the two best distinguishable plans; each runs two
    # throw-away iterations (one warm-up) and the faster as measured is launched, with its
    # own simulated price as the prediction.
    run_dir = tmp_path / "run"
    proc = run_cli([*TINY, "placement=auto", "run.video=false", "run.trial_plans=2",
                    "run.trial_margin=100", "run.trial_steps=2",
                    f"run.profile_cache={auto_dry_run[0]}", "--run-dir", str(run_dir)],
                   ray_address=ray_address, timeout=300)
    assert proc.returncode == 0, proc.stderr
    assert "auto: priced from the profile" in proc.stdout  # the trials are measured afresh
    assert "auto: 2 plans priced within 10000% of the best; running each for 2 iterations" \
        in proc.stdout
    summary = summary_of(run_dir)
    trials = summary["trials"]
    assert len(trials) == 2 and trials[0]["plan"] != trials[1]["plan"]
    assert all(len(t["step_seconds"]) == 1 and t["measured_s"] > 0 for t in trials)
    fastest = min(trials, key=lambda t: t["measured_s"])
    assert summary["placement"] == fastest["plan"]
    assert summary["predicted_iteration_s"] == pytest.approx(fastest["predicted_s"], rel=1e-6)
    assert summary["lock_switches_per_iteration"] == summary["simulated_switches"]
    assert proc.stdout.count("trial               ") == 2
