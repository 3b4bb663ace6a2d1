"""``rlinf-reasoning``: GRPO/PPO on math from the command line.

    rlinf-reasoning                                     # the default run (see README)
    rlinf-reasoning run.steps=30 placement=disaggregated algorithm=ppo cluster.cpu_slots=4
    rlinf-reasoning "placement='rollout: 0, actor,reward,inference: 1'"
    rlinf-reasoning placement=auto --dry-run            # profile, print the ranked plans, stop
    rlinf-reasoning --run-dir runs/a --resume           # continue from the latest checkpoint
    rlinf-reasoning export runs/a --out models/a        # a checkpoint as a Hugging Face folder
    rlinf-reasoning --config-dir my_conf --config-name exp1   # your own config file
    rlinf-reasoning -m algorithm.lr=1e-4,3e-4 run.seed=0,1 --run-dir runs/sweep   # 4 runs

Arguments other than the flags are Hydra overrides of ``conf/config.yaml`` (``key=value``,
``algorithm=ppo`` picks ``conf/algorithm/ppo.yaml``). The composed config is validated into a
`ReasoningConfig` before anything starts; a bad one exits with status 2 and one line naming
the key, the value and what is allowed.

Your own config: ``--config-dir DIR --config-name NAME`` composes ``DIR/NAME.yaml`` with the
shipped folder behind it, so it can start from the shipped config and change what it needs::

    defaults:
      - config                    # the shipped conf/config.yaml
      - override algorithm: ppo   # a shipped group option (or one of DIR/algorithm/)
      - _self_
    run:
      steps: 30

``-m``/``--multirun`` runs a sweep (`rlinf_reasoning.sweep`): one run per combination of the
comma-separated values, in ``RUN_DIR/0``, ``RUN_DIR/1``, ..., every job's config checked
before the first one starts, and a table of their held-out accuracies at the end.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from rlinf.workers.cli import AppCLI, ExportCommand
from rlinf.workers.reasoning import RANK_MODULES
from rlinf_reasoning.config import ReasoningConfig, from_omegaconf

__all__ = ["CLI", "CONF_DIR", "compose_config", "help_text", "main", "parse_args"]

CONF_DIR = Path(__file__).resolve().parent / "conf"
"""The Hydra config folder shipped in the package."""


def _sweep_result(run_dir: Path) -> str | None:
    """A finished job's held-out accuracy before -> after, from its summary."""
    from rlinf.workers.training.report import SUMMARY_FILE
    from rlinf_reasoning.report import format_fixed

    path = run_dir / SUMMARY_FILE
    if not path.is_file():
        return None
    summary = json.loads(path.read_text(encoding="utf-8"))
    return (f"held-out {format_fixed(summary['heldout_before'], 3)} -> "
            f"{format_fixed(summary['heldout_after'], 3)} "
            f"({format_fixed(summary['gain_points'], 1, sign=True)} points)")


def _export(run_dir: Path, out: Path, *, step: int | None, merge: bool) -> Path:
    from rlinf_reasoning.export import export_checkpoint

    return export_checkpoint(run_dir, out, step=step, merge=merge)


EXPORT = ExportCommand(
    "Write a run's checkpoint as a Hugging Face folder (safetensors, config, tokenizer) that "
    "transformers, vLLM and SGLang load.", _export,
    flags={"merge": "a LoRA run: write the model with the adapter merged in (default: the "
                    "adapter in PEFT's layout)"})


CLI: AppCLI[ReasoningConfig] = AppCLI(
    prog="rlinf-reasoning", usage="\n\n".join((__doc__ or "").strip().split("\n\n")[:2]),
    conf_dir=CONF_DIR, schema=ReasoningConfig, load=from_omegaconf,
    run_dir_of=lambda cfg: Path(cfg.run.run_dir), train_module="rlinf_reasoning.run",
    log_level_of=lambda cfg: cfg.run.log_level, rank_modules=RANK_MODULES,
    renamed={"run.tensorboard": "run.loggers, a list: e.g. run.loggers=[jsonl] for no "
                                "TensorBoard, run.loggers=[jsonl,tensorboard,wandb]"},
    sweep_result=_sweep_result, export=EXPORT)
"""``rlinf-reasoning``'s command line (`rlinf.workers.cli.AppCLI`)."""


def compose_config(overrides: Sequence[str], *, run_dir: str | None = None,
                   config_dir: str | Path | None = None, config_name: str = "config") -> Any:
    """The composed `DictConfig` of a command line's overrides (`AppCLI.compose`)."""
    return CLI.compose(overrides, run_dir=run_dir, config_dir=config_dir,
                       config_name=config_name)


def parse_args(argv: Sequence[str]) -> tuple[argparse.Namespace, list[str]]:
    """The flags and the Hydra overrides of `argv`."""
    return CLI.parse_args(argv)


def help_text() -> str:
    """Usage, flags, config groups and every config key."""
    return CLI.help_text()


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of ``rlinf-reasoning``; returns the exit status."""
    return CLI.main(argv)


if __name__ == "__main__":
    sys.exit(main())
