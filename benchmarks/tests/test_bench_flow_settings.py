"""bench_flow's settings: a user's own ``--setting APP KEY=VALUE ...`` beside the built-in
ones, and the command line each mode runs with it."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import bench_flow


def test_an_own_setting_is_its_app_and_overrides() -> None:
    setting = bench_flow.own_setting(["reasoning", "data.prompts_per_step=24",
                                      "rollout.group_size=6"], 0)
    assert (setting.app, setting.name) == ("reasoning", "own0")
    assert setting.overrides == ("data.prompts_per_step=24", "rollout.group_size=6")


@pytest.mark.parametrize("words", [["trl", "a=1"], ["reasoning"], ["embodied", "num_envs"],
                                   ["embodied", "=3"]])
def test_a_malformed_own_setting_is_refused(words: list[str]) -> None:
    with pytest.raises(ValueError, match="--setting"):
        bench_flow.own_setting(words, 0)


def test_each_mode_runs_the_own_overrides_after_the_common_ones(tmp_path: Path) -> None:
    setting = bench_flow.own_setting(["reasoning", "rollout.group_size=6"], 1)
    for mode in bench_flow.MODES:
        cmd = bench_flow.command(setting, mode, steps=5, iterations=5, run_dir=tmp_path)
        assert "rollout.group_size=6" in cmd
        assert cmd.index("rollout.group_size=6") > cmd.index("run.eval_every=0")
        assert f"placement={mode}" in cmd and "run.steps=5" in cmd


def test_own_settings_replace_the_built_in_ones_unless_named(
        monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    chosen: list[list[str]] = []

    class Stop(Exception):
        pass

    def stop(*_args: object, **_kwargs: object) -> None:
        raise Stop

    monkeypatch.setattr(bench_flow, "runtime", stop)
    for argv, expected in (
            (["--setting", "embodied", "env.num_envs=8"], ["embodied/own0"]),
            (["--setting", "embodied", "env.num_envs=8", "--settings", "ip-e8-s128"],
             ["embodied/ip-e8-s128", "embodied/own0"])):
        with pytest.raises(Stop):
            bench_flow.main(argv)
        out = capsys.readouterr().out
        chosen.append([line.split(":")[0].strip("# ").strip() for line in out.splitlines()
                       if line.startswith("#   ")])
        assert chosen[-1] == expected
