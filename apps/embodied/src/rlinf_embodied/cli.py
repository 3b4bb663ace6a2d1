"""`rlinf-embodied`: train an embodied policy with PPO or GRPO, configured with Hydra.

    rlinf-embodied                                  # PPO on InvertedDoublePendulum-v5, CPU
    rlinf-embodied task=pickcube run.iterations=3 placement=hybrid
    rlinf-embodied placement=auto --dry-run         # profile, print the planner's ranked plans
    rlinf-embodied --run-dir runs/a --resume        # continue from the latest checkpoint
    rlinf-embodied export runs/a --out policies/a   # the trained policy as policy.pt
    rlinf-embodied --config-dir my_conf --config-name exp1   # your own config file
    rlinf-embodied -m run.seed=0,1,2 --run-dir runs/seeds     # 3 runs, one per seed

Arguments of the form ``key=value`` (or ``group=option``) are Hydra overrides of the
composed config (`conf/config.yaml`); the config is validated completely before any worker
starts, and a bad one exits with status 2 and a message naming the key.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from rlinf.workers.cli import AppCLI, ExportCommand
from rlinf.workers.schema import to_dict
from rlinf_embodied.config import AppConfig, from_omegaconf, ray_options

__all__ = ["CLI", "CONF_DIR", "compose_config", "load_config", "main"]

CONF_DIR = Path(__file__).resolve().parent / "conf"
"""The app's Hydra config directory (shipped inside the wheel)."""

BASE_CONFIG = "rlinf_embodied_base"
"""Name under which the dataclass defaults are stored for `conf/config.yaml`'s defaults list."""

EXIT_TARGET_MISSED = 3
"""Exit status with --check-target when the trained policy missed the task's threshold."""


def _add_flags(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--check-target", action="store_true",
                        help=f"exit with status {EXIT_TARGET_MISSED} when the trained policy "
                             "misses the task's threshold")


def _after_train(summary: Any, args: argparse.Namespace) -> int:
    return EXIT_TARGET_MISSED if args.check_target and summary.target_reached is False else 0


def _sweep_result(run_dir: Path) -> str | None:
    """A finished job's evaluation return before -> after, from its summary."""
    path = run_dir / "summary.json"
    if not path.is_file():
        return None
    summary = json.loads(path.read_text(encoding="utf-8"))
    return (f"evaluation return {summary['eval_return_before']:.1f} -> "
            f"{summary['eval_return_after']:.1f}")


def _export(run_dir: Path, out: Path, *, step: int | None) -> Path:
    from rlinf_embodied.export import export_policy

    return export_policy(run_dir, out, step=step)


EXPORT = ExportCommand(
    "Write a run's trained policy as policy.pt (its network's shape and weights); "
    "rlinf_embodied.export.load_policy(DIR) rebuilds it.", _export)


CLI: AppCLI[AppConfig] = AppCLI(
    prog="rlinf-embodied", usage="\n\n".join((__doc__ or "").strip().split("\n\n")[:2]),
    conf_dir=CONF_DIR, schema=AppConfig, load=from_omegaconf,
    run_dir_of=lambda cfg: Path(cfg.run.run_dir), train_module="rlinf_embodied.run",
    ray_options=ray_options, unit="iteration", version_base="1.3",
    rank_modules=("rlinf.workers.embodied.roles", "rlinf.envs", "gymnasium"),  # not mujoco:
    # it picks its GL backend when imported, which an env that renders chooses first
    # every key with its dataclass default, so that `key=value` works for keys the YAML
    # files leave out while a misspelt key is still rejected
    structured_defaults=lambda: (BASE_CONFIG, to_dict(AppConfig())),
    sweep_result=_sweep_result, add_flags=_add_flags, after_train=_after_train,
    export=EXPORT)
"""``rlinf-embodied``'s command line (`rlinf.workers.cli.AppCLI`)."""


def compose_config(overrides: Sequence[str] = ()) -> Any:
    """The composed OmegaConf config of `conf/config.yaml` with Hydra `overrides` applied."""
    return CLI.compose(overrides)


def load_config(overrides: Sequence[str], *, run_dir: Path | None = None) -> AppConfig:
    """Compose and validate (`--run-dir` sets ``run.run_dir``): the `AppConfig` of one
    command line."""
    return CLI.load_config(overrides, run_dir=run_dir)


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the `rlinf-embodied` command; returns the exit status."""
    return CLI.main(argv)


if __name__ == "__main__":  # pragma: no cover - `python -m rlinf_embodied.cli`
    sys.exit(main())
