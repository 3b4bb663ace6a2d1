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
import difflib
import functools
import itertools
import sys
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, TextIO

from rlinf.envs.errors import DatasetError
from rlinf.sched.errors import SchedError
from rlinf.workers.errors import ConfigError, MissingExtraError, WorkersError
from rlinf_reasoning._schema import describe
from rlinf_reasoning.config import ReasoningConfig, config_dict, from_omegaconf
from rlinf_reasoning.errors import UnknownKeyError, UnquotedValueError
from rlinf_reasoning.sweep import SweepJob, sweep_jobs

__all__ = ["CONF_DIR", "compose_config", "main", "parse_args"]

CONF_DIR = Path(__file__).resolve().parent / "conf"
"""The Hydra config folder shipped in the package."""

EXIT_CONFIG = 2
"""Exit status of a config error."""
EXIT_FAILED = 1
"""Exit status of a run that failed (a worker died, planning failed)."""


def parse_args(argv: Sequence[str]) -> tuple[argparse.Namespace, list[str]]:
    """The flags and the Hydra overrides of `argv`."""
    parser = argparse.ArgumentParser(
        prog="rlinf-reasoning", add_help=False,
        description="RL (GRPO/PPO) on math reasoning with RLinf; KEY=VALUE overrides the config.")
    parser.add_argument("-h", "--help", action="store_true",
                        help="show this help and every config key, then exit")
    parser.add_argument("--dry-run", action="store_true",
                        help="print the resolved config and the placement/plan (for "
                             "placement=auto: profile and print the ranked plans), then exit")
    parser.add_argument("--run-dir", default=None,
                        help="folder for metrics, checkpoints, plots (sets run.run_dir)")
    parser.add_argument("--resume", action="store_true",
                        help="continue from the latest checkpoint in the run folder")
    parser.add_argument("--config-dir", default=None,
                        help="a folder of your own configs (the shipped one stays behind it)")
    parser.add_argument("--config-name", default="config",
                        help="the config to compose, NAME.yaml (default: config)")
    parser.add_argument("-m", "--multirun", action="store_true",
                        help="sweep: one run per combination of the comma-separated values")
    parser.add_argument("overrides", nargs="*", metavar="KEY=VALUE",
                        help="Hydra overrides, e.g. run.steps=30 algorithm=ppo")
    args = parser.parse_intermixed_args(list(argv))
    return args, list(args.overrides)


def help_text() -> str:
    """Usage, flags and every config key with its type, default and docstring."""
    lines = [__doc__.strip().split("\n\n")[1] if __doc__ else "", "", "Flags:",
             "  -h, --help       this help",
             "  --dry-run        print the resolved config and plan, then exit",
             "  --run-dir DIR    run folder (sets run.run_dir)",
             "  --resume         continue from the latest checkpoint in the run folder",
             "  --config-dir DIR your own config folder (the shipped one stays behind it)",
             "  --config-name N  compose N.yaml (default: config)",
             "  -m, --multirun   one run per combination of comma-separated values, in",
             "                   RUN_DIR/0, RUN_DIR/1, ...",
             "", "Config keys (KEY=VALUE; groups: algorithm=grpo|ppo, task=math|math_tools):"]
    section = ""
    for info in describe(ReasoningConfig):
        head = info.key.split(".")[0] if "." in info.key else ""
        if head != section:
            section = head
            lines.append(f"  {head}:")
        default = "null" if info.default is None else info.default
        if isinstance(default, tuple):
            default = list(default)
        lines.append(f"    {info.key} ({info.type}, default {default})")
        lines.append(f"        {info.doc}")
    return "\n".join(lines)


def _known_keys() -> set[str]:
    """Every dotted key, section and config group an override may name."""
    keys = {info.key for info in describe(ReasoningConfig)}
    groups = {p.name for p in CONF_DIR.iterdir() if p.is_dir()}
    return keys | {k.split(".")[0] for k in keys} | groups


_RENAMED = {"run.tensorboard": "run.loggers, a list: e.g. run.loggers=[jsonl] for no "
                                  "TensorBoard, run.loggers=[jsonl,tensorboard,wandb]"}
"""Keys of earlier versions → what to write instead."""


def _unquote(value: str) -> str:
    if len(value) >= 2 and value[0] == value[-1] and value[0] in "'\"":
        return value[1:-1]
    return value


def _explain_overrides(overrides: Sequence[str]) -> ConfigError | None:
    """A one-line error for the usual mistakes behind a failed composition (None: another).

    Hydra's own messages for these mislead: an unknown key gets "use +key=value" (which adds
    a key nothing reads), a value the shell split at its spaces gets a lexer error.
    """
    from hydra.core.override_parser.overrides_parser import OverridesParser
    from hydra.errors import HydraException

    def fragment(arg: str) -> bool:  # an argument that is no override: part of a split value
        return "=" not in arg and not arg.startswith("~")

    for i, arg in enumerate(overrides):
        end = i + 1
        while "=" in arg and end < len(overrides) and fragment(overrides[end]):
            end += 1
        if end > i + 1:
            key, _, value = arg.partition("=")
            return UnquotedValueError(key.lstrip("+"),
                                      _unquote(" ".join([value, *overrides[i + 1:end]])))
    parser = OverridesParser.create()
    known = _known_keys()
    list_keys = {i.key for i in describe(ReasoningConfig) if i.type.startswith("list")}
    for arg in overrides:
        try:
            override = parser.parse_override(arg)
        except HydraException:
            continue
        key = override.key_or_group
        if override.is_sweep_override() and key not in list_keys:
            return UnquotedValueError(key, arg.partition("=")[2])
        if override.is_add() or override.is_force_add() or override.is_delete() or \
                key in known or key.startswith("hydra."):
            continue
        if key in _RENAMED:
            return ConfigError(f"{key} was replaced by {_RENAMED[key]}")
        return UnknownKeyError(key, tuple(difflib.get_close_matches(key, known, n=1)))
    return None


def compose_config(overrides: Sequence[str], *, run_dir: str | None = None,
                   config_dir: str | Path | None = None, config_name: str = "config") -> Any:
    """The composed `DictConfig`; a `ConfigError` (see `_explain_overrides`) on a bad override.

    `config_dir` puts a user's config folder in front of the shipped one (`CONF_DIR`), which
    stays on the search path, and `config_name` picks the file to compose.
    """
    from hydra import compose, initialize_config_dir
    from hydra.errors import HydraException, MissingConfigException
    from omegaconf.errors import OmegaConfBaseException

    all_overrides = list(overrides)
    primary = CONF_DIR
    if config_dir is not None:
        primary = Path(config_dir).expanduser().resolve()
        if not primary.is_dir():
            raise ConfigError(f"--config-dir {config_dir}: not a folder; give the folder that "
                              "holds your NAME.yaml")
        all_overrides.append(f"hydra.searchpath=[file://{CONF_DIR}]")
    if run_dir is not None:
        all_overrides.append(f"run.run_dir={run_dir}")
    try:
        with initialize_config_dir(config_dir=str(primary), version_base=None):
            return compose(config_name=config_name, overrides=all_overrides)
    except MissingConfigException as exc:
        if not (primary / f"{config_name}.yaml").is_file() and \
                not (CONF_DIR / f"{config_name}.yaml").is_file():
            raise ConfigError(f"--config-name {config_name}: no {config_name}.yaml in "
                              f"{primary}") from exc
        message = " ".join(str(exc).split())
        raise ConfigError(f"{config_name}.yaml in {primary}: {message}") from exc
    except (HydraException, OmegaConfBaseException) as exc:
        explained = _explain_overrides(overrides)
        if explained is not None:
            raise explained from exc
        message = " ".join(str(exc).split())
        raise ConfigError(f"cannot compose {config_name}.yaml with the overrides "
                          f"{list(overrides)}: {message}; run `rlinf-reasoning --help` for the "
                          "keys and their types") from exc


def _print_config(cfg: ReasoningConfig, out: TextIO) -> None:
    print("config:", file=out)
    for key, value in config_dict(cfg).items():
        print(f"  {key}: {'null' if value is None else value}", file=out)


def export_main(argv: Sequence[str]) -> int:
    """``rlinf-reasoning export RUN_DIR [--step N] --out DIR [--merge]``; returns the exit
    status."""
    parser = argparse.ArgumentParser(
        prog="rlinf-reasoning export",
        description="Write a run's checkpoint as a Hugging Face folder (safetensors, config, "
                    "tokenizer) that transformers, vLLM and SGLang load.")
    parser.add_argument("run_dir", type=Path, help="the run folder (its --run-dir)")
    parser.add_argument("--step", type=int, default=None,
                        help="the checkpoint's step (default: the latest)")
    parser.add_argument("--out", type=Path, required=True, help="the folder to write")
    parser.add_argument("--merge", action="store_true",
                        help="a LoRA run: write the model with the adapter merged in "
                             "(default: the adapter in PEFT's layout)")
    args = parser.parse_args(list(argv))
    from rlinf_reasoning.export import export_checkpoint

    try:
        out = export_checkpoint(args.run_dir, args.out, step=args.step, merge=args.merge)
    except ConfigError as exc:
        print(f"rlinf-reasoning export: {exc}", file=sys.stderr)
        return EXIT_CONFIG
    print(f"exported to {out}")
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of ``rlinf-reasoning``; returns the exit status."""
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv[:1] == ["export"]:
        return export_main(argv[1:])
    args, overrides = parse_args(argv)
    if args.help:
        print(help_text())
        return 0
    from rlinf.workers.telemetry import configure_logging

    configure_logging(level="warning")
    if args.multirun:
        return _multirun(args, overrides)
    try:
        cfg = _load(args, overrides, run_dir=args.run_dir)
    except (ConfigError, MissingExtraError) as exc:
        print(f"rlinf-reasoning: config error: {exc}", file=sys.stderr)
        return EXIT_CONFIG
    return _run(cfg, args, overrides)


def _load(args: argparse.Namespace, overrides: Sequence[str],
          run_dir: str | None) -> ReasoningConfig:
    return from_omegaconf(compose_config(overrides, run_dir=run_dir,
                                         config_dir=args.config_dir,
                                         config_name=args.config_name))


def _run(cfg: ReasoningConfig, args: argparse.Namespace, overrides: Sequence[str]) -> int:
    """Dry-run or train one validated config; the exit status."""
    from rlinf.workers.telemetry import configure_logging

    configure_logging(level=cfg.run.log_level)
    if args.dry_run:
        from rlinf_reasoning.run import dry_run

        _print_config(cfg, sys.stdout)
        try:
            dry_run(cfg, out=sys.stdout)
        except (ConfigError, DatasetError) as exc:
            print(f"rlinf-reasoning: config error: {exc}", file=sys.stderr)
            return EXIT_CONFIG
        return 0
    try:
        train = _train_with_ray_starting()
        train(cfg, resume=args.resume, overrides=overrides)
    except (ConfigError, DatasetError) as exc:  # a data file changed since it was checked
        print(f"rlinf-reasoning: {exc}", file=sys.stderr)
        return EXIT_CONFIG
    except KeyboardInterrupt:
        print(f"rlinf-reasoning: interrupted; {_how_to_continue(cfg)}", file=sys.stderr)
        return 130
    except (WorkersError, SchedError) as exc:
        # A dead or stuck worker, a failed plan: the checkpoints written so far are intact.
        print(f"rlinf-reasoning: run failed: {type(exc).__name__}: {exc}; "
              f"{_how_to_continue(cfg)}", file=sys.stderr)
        return EXIT_FAILED
    return 0


def _how_to_continue(cfg: ReasoningConfig) -> str:
    """`--resume` when the run folder holds a checkpoint to resume from; else that the run
    has to start again (nothing was saved yet)."""
    from rlinf.workers.telemetry import CheckpointStore
    from rlinf.workers.training import CHECKPOINT_DIR

    latest = CheckpointStore(Path(cfg.run.run_dir).expanduser() / CHECKPOINT_DIR).latest()
    if latest is None:
        return ("no checkpoint was written yet: run the same command again (in a new "
                "--run-dir, or after removing this one)")
    return f"continue from the checkpoint of step {latest[0]} with --resume"


def _train_with_ray_starting() -> Callable[..., object]:
    """`rlinf_reasoning.run.train`, imported while Ray starts
    (`rlinf.workers.runtime.ray_session.import_while_ray_starts`); the first session of the
    returned `train` owns the Ray it started."""
    from rlinf.workers.runtime.ray_session import import_while_ray_starts

    run, started = import_while_ray_starts("rlinf_reasoning.run")
    return functools.partial(run.train, ray_started=started)


def _multirun(args: argparse.Namespace, overrides: Sequence[str]) -> int:
    """Every job of the sweep, one after another; every config is checked before any runs."""
    try:
        jobs = sweep_jobs(overrides)
        # --run-dir, else the composed run.run_dir of the sweep's first job
        base = Path(args.run_dir if args.run_dir is not None
                    else _load(args, jobs[0].overrides, run_dir=None).run.run_dir)
        configs = [_load(args, job.overrides, run_dir=str(job.run_dir(base))) for job in jobs]
    except (ConfigError, MissingExtraError) as exc:
        print(f"rlinf-reasoning: config error: {exc}", file=sys.stderr)
        return EXIT_CONFIG
    print(f"multirun: {len(jobs)} jobs in {base}", flush=True)
    statuses: list[int] = []
    owns_ray = False
    if not args.dry_run:  # one local Ray for every job: each would start and stop its own
        from rlinf.workers.flow import ensure_ray

        owns_ray = ensure_ray()
    try:
        for job, cfg in zip(jobs, configs, strict=True):
            print(f"multirun job {job.index} of {len(jobs)}: {' '.join(job.swept)} "
                  f"-> {job.run_dir(base)}", flush=True)
            status = _run(cfg, args, job.overrides)
            statuses.append(status)
            if status == 130:
                print(f"rlinf-reasoning: sweep interrupted at job {job.index}; rerun the same "
                      "command with --resume to continue", file=sys.stderr)
                break
    finally:
        if owns_ray:
            from rlinf.workers.runtime.ray_session import stop_ray

            stop_ray()
    _print_sweep(jobs, base, statuses, sys.stdout)
    return next((status for status in statuses if status != 0), 0)


def _print_sweep(jobs: Sequence[SweepJob], base: Path, statuses: Sequence[int],
                 out: TextIO) -> None:
    """One line per job: its swept values and held-out accuracy before -> after."""
    import json

    from rlinf_reasoning.report import SUMMARY_FILE, format_fixed

    print("multirun summary (held-out greedy accuracy before -> after):", file=out)
    for job, status in itertools.zip_longest(jobs, statuses):
        result = "not run" if status is None else f"failed (exit {status})"
        path = job.run_dir(base) / SUMMARY_FILE
        if status == 0 and path.is_file():
            summary = json.loads(path.read_text(encoding="utf-8"))
            result = (f"{format_fixed(summary['heldout_before'], 3)} -> "
                      f"{format_fixed(summary['heldout_after'], 3)} "
                      f"({format_fixed(summary['gain_points'], 1, sign=True)} points)")
        elif status == 0:
            result = "ok"
        print(f"  {job.index}: {' '.join(job.swept)}: {result}", file=out)


if __name__ == "__main__":
    sys.exit(main())
