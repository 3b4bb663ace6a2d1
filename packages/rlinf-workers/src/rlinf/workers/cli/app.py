"""`AppCLI`: the command line every app shares, in one layout.

    <prog> [KEY=VALUE ...] [--run-dir DIR] [--resume] [--dry-run]
           [--config-dir DIR --config-name NAME] [-m] [--log-level LEVEL]
    <prog> export RUN_DIR --out DIR [...]

Arguments other than the flags are Hydra overrides of the app's shipped ``conf/config.yaml``
(``key=value``, ``group=option``). The composed config is validated into the app's frozen
config dataclass before anything starts; a bad one exits 2 with one line,
``<prog>: config error: ...``, naming the key, the value and what is allowed (an unknown
key with the closest known one, a value the shell split at its spaces with how to quote it).
``--config-dir DIR --config-name NAME`` composes ``DIR/NAME.yaml`` with the shipped folder
behind it on Hydra's search path. ``-m`` runs a sweep (`rlinf.workers.cli.sweep`): every
job's config checked before the first one starts, one after another on one local Ray, in
``RUN_DIR/<i>``, and a table of their results at the end. A run that fails exits 1 and an
interrupted one 130, each saying whether ``--resume`` can continue it.

The app supplies its name, usage text, config folder and dataclass, how to validate a
composed config, where a config's run folder is, and the module whose ``train`` and
``dry_run`` run it; Hydra is imported only here, when a command line is read.
"""

from __future__ import annotations

import argparse
import difflib
import itertools
import sys
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Generic, TextIO, TypeVar

from rlinf.envs.errors import DatasetError
from rlinf.sched.errors import SchedError
from rlinf.workers.cli.errors import NotAnOverrideError, UnknownKeyError, UnquotedValueError
from rlinf.workers.cli.export import ExportCommand
from rlinf.workers.cli.sweep import SweepJob, sweep_jobs
from rlinf.workers.errors import ConfigError, MissingExtraError, WorkersError
from rlinf.workers.schema import describe, to_dict

__all__ = ["EXIT_CONFIG", "EXIT_FAILED", "EXIT_INTERRUPTED", "AppCLI"]

EXIT_CONFIG = 2
"""Exit status of a rejected command line or config."""
EXIT_FAILED = 1
"""Exit status of a run that failed (a worker died, planning failed)."""
EXIT_INTERRUPTED = 130
"""Exit status after Ctrl-C."""

C = TypeVar("C")


def _unquote(value: str) -> str:
    if len(value) >= 2 and value[0] == value[-1] and value[0] in "'\"":
        return value[1:-1]
    return value


def _flatten(data: Mapping[Any, Any], prefix: str = "") -> dict[str, Any]:
    """A composed config's plain data as dotted keys (no validation: ``--help`` reads it)."""
    out: dict[str, Any] = {}
    for key, value in data.items():
        if isinstance(value, Mapping):
            out |= _flatten(value, f"{prefix}{key}.")
        else:
            out[f"{prefix}{key}"] = value
    return out


def _fragment(arg: str) -> bool:
    """An argument that is no override: a word of a value the shell split, or a typo."""
    return "=" not in arg and not arg.startswith("~")


@dataclass(frozen=True)
class AppCLI(Generic[C]):
    """One app's command line (module docstring)."""

    prog: str
    """The command, e.g. ``rlinf-reasoning``."""
    usage: str
    """Examples shown first by ``--help``."""
    conf_dir: Path
    """The Hydra config folder shipped in the app."""
    schema: type
    """The config dataclass (its keys, types and docstrings make the help page)."""
    load: Callable[[Any], C]
    """A composed config (OmegaConf) validated into the app's config."""
    run_dir_of: Callable[[C], Path]
    """A config's run folder."""
    train_module: str
    """The module whose ``train(cfg, resume=, overrides=, ray_started=)`` and
    ``dry_run(cfg, out=)`` run a config; imported while Ray starts."""
    ray_options: Callable[[C], Mapping[str, Any]] = lambda _cfg: {}
    """`rlinf.workers.flow.ensure_ray`'s options for a run of a config."""
    rank_modules: tuple[str, ...] = ()
    """What the run's worker processes import (their roles, the model code): on one
    machine a server imports them once, while the driver imports its own, and forks every
    worker process from it (`rlinf.workers.runtime.local`)."""
    log_level_of: Callable[[C], str] = lambda _cfg: "warning"
    """The log level a config asks for (``--log-level`` wins)."""
    unit: str = "step"
    """What one iteration is called in the lines about checkpoints."""
    run_dir_key: str = "run.run_dir"
    """The key ``--run-dir`` sets."""
    version_base: str | None = None
    """Hydra's ``version_base`` for the app's config files."""
    structured_defaults: Callable[[], tuple[str, Mapping[str, Any]]] | None = None
    """A config node stored in Hydra's ConfigStore under a name the defaults list uses (every
    key with its dataclass default), or None."""
    renamed: Mapping[str, str] = field(default_factory=dict)
    """Keys of earlier versions → what to write instead."""
    sweep_result: Callable[[Path], str | None] | None = None
    """One finished sweep job's result for the sweep's table, read from its run folder."""
    add_flags: Callable[[argparse.ArgumentParser], None] | None = None
    """Flags of the app's own (shown in the help after the shared ones)."""
    after_train: Callable[[Any, argparse.Namespace], int] | None = None
    """The exit status of a finished run from its summary and the flags (0 by default)."""
    export: ExportCommand | None = None
    """``<prog> export ...``, or None."""

    # -- the command line ----------------------------------------------------------------------
    def parser(self) -> argparse.ArgumentParser:
        """The flags every app takes, then the app's own."""
        parser = argparse.ArgumentParser(prog=self.prog, add_help=False)
        parser.add_argument("-h", "--help", action="store_true",
                            help="this help: the flags, the config groups and every key")
        parser.add_argument("--dry-run", action="store_true",
                            help="print the resolved config and the plan, then exit")
        parser.add_argument("--run-dir", default=None,
                            help=f"the run folder (sets {self.run_dir_key})")
        parser.add_argument("--resume", action="store_true",
                            help="continue from the latest checkpoint in the run folder")
        parser.add_argument("--config-dir", default=None,
                            help="your own config folder (the shipped one stays behind it)")
        parser.add_argument("--config-name", default="config",
                            help="the config to compose, NAME.yaml (default: config)")
        parser.add_argument("-m", "--multirun", action="store_true",
                            help="one run per combination of comma-separated values, in "
                                 "RUN_DIR/0, RUN_DIR/1, ...")
        parser.add_argument("--log-level", default=None,
                            help="the app's log level (default: the config's, or warning)")
        if self.add_flags is not None:
            self.add_flags(parser)
        parser.add_argument("overrides", nargs="*", metavar="KEY=VALUE",
                            help="Hydra overrides, e.g. run.seed=1")
        return parser

    def parse_args(self, argv: Sequence[str]) -> tuple[argparse.Namespace, list[str]]:
        """The flags and the Hydra overrides of `argv`."""
        args = self.parser().parse_intermixed_args(list(argv))
        return args, list(args.overrides)

    def groups(self) -> dict[str, list[str]]:
        """Each config group of the shipped folder and its options."""
        return {p.name: sorted(y.stem for y in p.glob("*.yaml"))
                for p in sorted(self.conf_dir.iterdir()) if p.is_dir()}

    def help_text(self) -> str:
        """Usage, flags, config groups and every config key with its type, the default
        config's value and its docstring."""
        from omegaconf import OmegaConf

        composed = OmegaConf.to_container(self.compose([]), resolve=True)
        defaults = _flatten(composed) if isinstance(composed, Mapping) else {}
        lines = [self.usage.strip(), "", "Flags:"]
        for action in self.parser()._actions:
            if action.option_strings:
                lines.append(f"  {', '.join(action.option_strings):18s} {action.help}")
        lines += ["", "Config groups (GROUP=OPTION):"]
        lines += [f"  {group}={'|'.join(options)}" for group, options in self.groups().items()]
        lines += ["", "Config keys (KEY=VALUE; the default config's value shown). A value with "
                  "spaces or commas needs quotes for the shell and for Hydra, e.g. "
                  "\"key='a, b'\":"]
        section = ""
        for info in describe(self.schema):
            head = info.key.split(".")[0] if "." in info.key else ""
            if head != section:
                section = head
                lines.append(f"  {head}:")
            default = defaults.get(info.key, info.default)
            shown = "null" if default is None else (list(default) if isinstance(default, tuple)
                                                     else default)
            lines.append(f"    {info.key}={shown}  ({info.type})")
            if info.doc:
                lines.append(f"        {info.doc}")
        return "\n".join(lines)

    # -- composition ---------------------------------------------------------------------------
    def known_keys(self) -> set[str]:
        """Every dotted key, section and config group an override may name."""
        keys = {info.key for info in describe(self.schema)}
        return keys | {k.split(".")[0] for k in keys} | set(self.groups())

    def explain(self, overrides: Sequence[str]) -> ConfigError | None:
        """A one-line error for the usual mistakes behind a failed composition (None for
        another). Hydra's own messages for these mislead: an unknown key gets "use
        +key=value" (which adds a key nothing reads), a value the shell split at its spaces
        a lexer error."""
        from hydra.core.override_parser.overrides_parser import OverridesParser
        from hydra.errors import HydraException

        for i, arg in enumerate(overrides):
            end = i + 1
            while "=" in arg and end < len(overrides) and _fragment(overrides[end]):
                end += 1
            if end > i + 1:
                key, _, value = arg.partition("=")
                return UnquotedValueError(key.lstrip("+"),
                                          _unquote(" ".join([value, *overrides[i + 1:end]])))
        stray = next((arg for arg in overrides if _fragment(arg)), None)
        if stray is not None:
            return NotAnOverrideError(stray, self.prog)
        parser = OverridesParser.create()
        known = self.known_keys()
        list_keys = {i.key for i in describe(self.schema) if i.type.startswith("list")}
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
            if key in self.renamed:
                return ConfigError(f"{key} was replaced by {self.renamed[key]}")
            return UnknownKeyError(key, tuple(difflib.get_close_matches(key, known, n=1)),
                                   self.prog)
        return None

    def compose(self, overrides: Sequence[str], *, run_dir: str | Path | None = None,
                config_dir: str | Path | None = None, config_name: str = "config") -> Any:
        """The composed `DictConfig`; a `ConfigError` (see `explain`) on a bad override.
        `config_dir` puts a user's config folder in front of the shipped one, which stays
        on the search path, and `config_name` picks the file to compose."""
        from hydra import compose, initialize_config_dir
        from hydra.errors import HydraException, MissingConfigException
        from omegaconf.errors import OmegaConfBaseException

        if self.structured_defaults is not None:
            from hydra.core.config_store import ConfigStore

            name, node = self.structured_defaults()
            ConfigStore.instance().store(name=name, node=dict(node))
        stray = next((arg for arg in overrides if _fragment(arg)), None)
        if stray is not None:
            raise self.explain(overrides) or NotAnOverrideError(stray, self.prog)
        all_overrides = list(overrides)
        primary = self.conf_dir
        if config_dir is not None:
            primary = Path(config_dir).expanduser().resolve()
            if not primary.is_dir():
                raise ConfigError(f"--config-dir {config_dir}: not a folder; give the folder "
                                  "that holds your NAME.yaml")
            all_overrides.append(f"hydra.searchpath=[file://{self.conf_dir}]")
        if run_dir is not None:
            all_overrides.append(f"{self.run_dir_key}={run_dir}")
        try:
            with initialize_config_dir(config_dir=str(primary), version_base=self.version_base,
                                       job_name=self.prog):
                return compose(config_name=config_name, overrides=all_overrides)
        except MissingConfigException as exc:
            if not (primary / f"{config_name}.yaml").is_file() and \
                    not (self.conf_dir / f"{config_name}.yaml").is_file():
                raise ConfigError(f"--config-name {config_name}: no {config_name}.yaml in "
                                  f"{primary}") from exc
            raise ConfigError(f"{config_name}.yaml in {primary}: "
                              f"{' '.join(str(exc).split())}") from exc
        except (HydraException, OmegaConfBaseException) as exc:
            explained = self.explain(overrides)
            if explained is not None:
                raise explained from exc
            raise ConfigError(f"cannot compose {config_name}.yaml with the overrides "
                              f"{list(overrides)}: {' '.join(str(exc).split())}; run "
                              f"`{self.prog} --help` for the keys and their types") from exc

    def load_config(self, overrides: Sequence[str], *, run_dir: str | Path | None = None,
                    config_dir: str | Path | None = None, config_name: str = "config") -> C:
        """Compose and validate: the app's config of one command line."""
        return self.load(self.compose(overrides, run_dir=run_dir, config_dir=config_dir,
                                      config_name=config_name))

    # -- running -------------------------------------------------------------------------------
    def main(self, argv: Sequence[str] | None = None) -> int:
        """The entry point; returns the exit status."""
        argv = list(sys.argv[1:] if argv is None else argv)
        if argv[:1] == ["export"] and self.export is not None:
            return self.export.main(self.prog, argv[1:])
        args, overrides = self.parse_args(argv)
        if args.help:
            print(self.help_text())
            return 0
        from rlinf.workers.telemetry import configure_logging

        configure_logging(level=args.log_level or "warning")
        if not args.dry_run:
            # The ranks' imports start now, beside the config's composition and the
            # driver's own imports: a run's first step waits on them otherwise.
            from rlinf.workers.runtime.backend import start_local_early

            start_local_early(self.rank_modules)
        if args.multirun:
            return self._multirun(args, overrides)
        try:
            cfg = self._load(args, overrides, run_dir=args.run_dir)
        except (ConfigError, MissingExtraError, DatasetError) as exc:
            return self._refused(exc)
        return self._run(cfg, args, overrides)

    def _load(self, args: argparse.Namespace, overrides: Sequence[str],
              run_dir: str | Path | None) -> C:
        return self.load_config(overrides, run_dir=run_dir, config_dir=args.config_dir,
                                config_name=args.config_name)

    def _refused(self, exc: BaseException) -> int:
        print(f"{self.prog}: config error: {exc}", file=sys.stderr)
        return EXIT_CONFIG

    def _run(self, cfg: C, args: argparse.Namespace, overrides: Sequence[str]) -> int:
        """Dry-run or train one validated config; the exit status."""
        import importlib

        from rlinf.workers.telemetry import configure_logging

        configure_logging(level=args.log_level or self.log_level_of(cfg))
        if args.dry_run:
            import yaml

            print(yaml.safe_dump(to_dict(cfg), sort_keys=False).rstrip())
            try:
                importlib.import_module(self.train_module).dry_run(cfg, out=sys.stdout)
            except (ConfigError, MissingExtraError, DatasetError) as exc:
                return self._refused(exc)
            return 0
        from rlinf.workers.runtime.ray_session import import_while_ray_starts

        try:
            run, started = import_while_ray_starts(self.train_module, preload=self.rank_modules,
                                                   **self.ray_options(cfg))
            summary = run.train(cfg, resume=args.resume, overrides=overrides,
                                ray_started=started)
        except (ConfigError, MissingExtraError, DatasetError) as exc:
            return self._refused(exc)
        except KeyboardInterrupt:
            print(f"{self.prog}: interrupted; {self.how_to_continue(cfg)}", file=sys.stderr)
            return EXIT_INTERRUPTED
        except (WorkersError, SchedError) as exc:
            # A dead or stuck worker, a failed plan: the checkpoints written so far are intact.
            print(f"{self.prog}: run failed: {type(exc).__name__}: {exc}; "
                  f"{self.how_to_continue(cfg)}", file=sys.stderr)
            return EXIT_FAILED
        return self.after_train(summary, args) if self.after_train is not None else 0

    def how_to_continue(self, cfg: C) -> str:
        """`--resume` when the run folder holds a checkpoint to resume from; else that the
        run has to start again (nothing was saved yet)."""
        from rlinf.workers.telemetry import CheckpointStore
        from rlinf.workers.training import CHECKPOINT_DIR

        latest = CheckpointStore(Path(self.run_dir_of(cfg)).expanduser()
                                 / CHECKPOINT_DIR).latest()
        if latest is None:
            return ("no checkpoint was written yet: run the same command again (in a new "
                    "--run-dir, or after removing this one)")
        return f"continue from the checkpoint of {self.unit} {latest[0]} with --resume"

    def _multirun(self, args: argparse.Namespace, overrides: Sequence[str]) -> int:
        """Every job of the sweep, one after another; every config is checked before any
        runs."""
        try:
            jobs = sweep_jobs(overrides)
            # --run-dir, else the composed run folder of the sweep's first job
            base = Path(args.run_dir) if args.run_dir is not None else \
                Path(self.run_dir_of(self._load(args, jobs[0].overrides, run_dir=None)))
            configs = [self._load(args, job.overrides, run_dir=str(job.run_dir(base)))
                       for job in jobs]
        except (ConfigError, MissingExtraError, DatasetError) as exc:
            return self._refused(exc)
        print(f"multirun: {len(jobs)} jobs in {base}", flush=True)
        statuses: list[int] = []
        owns_ray = False
        if not args.dry_run:  # one backend for every job: each would start and stop its own
            from rlinf.workers.runtime.backend import start_runtime

            owns_ray = start_runtime(self.rank_modules, **self.ray_options(configs[0]))
        try:
            for job, cfg in zip(jobs, configs, strict=True):
                print(f"multirun job {job.index} of {len(jobs)}: {' '.join(job.swept)} "
                      f"-> {job.run_dir(base)}", flush=True)
                status = self._run(cfg, args, job.overrides)
                statuses.append(status)
                if status == EXIT_INTERRUPTED:
                    print(f"{self.prog}: sweep interrupted at job {job.index}; rerun the same "
                          "command with --resume to continue", file=sys.stderr)
                    break
        finally:
            if owns_ray:
                from rlinf.workers.runtime.ray_session import stop_ray

                stop_ray()
        self._print_sweep(jobs, base, statuses, sys.stdout)
        return next((status for status in statuses if status != 0), 0)

    def _print_sweep(self, jobs: Sequence[SweepJob], base: Path, statuses: Sequence[int],
                     out: TextIO) -> None:
        """One line per job: its swept values and its result."""
        print("multirun summary:", file=out)
        for job, status in itertools.zip_longest(jobs, statuses):
            result = "not run" if status is None else f"failed (exit {status})"
            if status == 0:
                said = self.sweep_result(job.run_dir(base)) if self.sweep_result else None
                result = said or "ok"
            print(f"  {job.index}: {' '.join(job.swept)}: {result}", file=out)
