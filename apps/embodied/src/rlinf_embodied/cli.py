"""`rlinf-embodied`: train an embodied policy with PPO or GRPO, configured with Hydra.

    rlinf-embodied                                  # PPO on InvertedDoublePendulum-v5, CPU
    rlinf-embodied task=pickcube run.iterations=3 placement=hybrid
    rlinf-embodied placement=auto --dry-run         # profile, print the planner's ranked plans
    rlinf-embodied --run-dir runs/a --resume        # continue from the latest checkpoint
    rlinf-embodied export runs/a --out policies/a   # the trained policy as policy.pt

Arguments of the form ``key=value`` (or ``group=option``) are Hydra overrides of the
composed config (`conf/config.yaml`); the config is validated completely before any worker
starts, and a bad one exits with status 2 and a message naming the key.
"""

from __future__ import annotations

import argparse
import dataclasses
import difflib
import functools
import sys
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from rlinf.workers.errors import ConfigError, MissingExtraError, WorkersError
from rlinf_embodied.config import AppConfig, from_omegaconf, ray_options
from rlinf_embodied.errors import CheckpointMismatchError, UnknownKeyError, UnquotedValueError

if TYPE_CHECKING:
    from rlinf_embodied.summary import RunSummary
from rlinf_embodied.schema import describe_fields, to_dict

__all__ = ["CONF_DIR", "compose_config", "main"]

CONF_DIR = Path(__file__).resolve().parent / "conf"
"""The app's Hydra config directory (shipped inside the wheel)."""

BASE_CONFIG = "rlinf_embodied_base"
"""Name under which the dataclass defaults are stored for `conf/config.yaml`'s defaults list."""

EXIT_CONFIG = 2
"""Exit status of a rejected config or command line."""
EXIT_FAILED = 1
"""Exit status when a worker died or timed out during the run."""
EXIT_TARGET_MISSED = 3
"""Exit status with --check-target when the trained policy missed the task's threshold."""
EXIT_INTERRUPTED = 130
"""Exit status after Ctrl-C (SIGINT)."""


def _group_options(group: str) -> list[str]:
    return sorted(p.stem for p in (CONF_DIR / group).glob("*.yaml"))


def _unquote(value: str) -> str:
    if len(value) >= 2 and value[0] == value[-1] and value[0] in "'\"":
        return value[1:-1]
    return value


def _split_value(overrides: Sequence[str]) -> UnquotedValueError | None:
    """The error for a ``key=value`` whose value the shell split at its spaces (the words
    after it are no overrides), or None."""
    for i, arg in enumerate(overrides):
        end = i + 1
        while "=" in arg and end < len(overrides) and "=" not in overrides[end]:
            end += 1
        if end > i + 1:
            key, _, value = arg.partition("=")
            return UnquotedValueError(key.lstrip("+"),
                                      _unquote(" ".join([value, *overrides[i + 1:end]])))
    return None


def _explain(overrides: Sequence[str]) -> ConfigError | None:
    """A one-line error for an unknown key or an unquoted value, Hydra's own messages for
    which mislead ("use +key=value" adds a key nothing reads); None for other failures."""
    from hydra.core.override_parser.overrides_parser import OverridesParser
    from hydra.errors import HydraException

    fields = list(describe_fields(AppConfig))
    known = {key for key, *_ in fields} | {key.split(".")[0] for key, *_ in fields}
    known |= {p.name for p in CONF_DIR.iterdir() if p.is_dir()}
    list_keys = {key for key, type_name, *_ in fields if type_name.startswith("list")}
    parser = OverridesParser.create()
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
        return UnknownKeyError(key, tuple(difflib.get_close_matches(key, known, n=1)))
    return None


def compose_config(overrides: Sequence[str] = ()) -> Any:
    """The composed OmegaConf config of `conf/config.yaml` with Hydra `overrides` applied."""
    from hydra import compose, initialize_config_dir
    from hydra.core.config_store import ConfigStore
    from hydra.errors import HydraException
    from omegaconf.errors import OmegaConfBaseException

    # Every key with its dataclass default, so that `key=value` works for keys the YAML files
    # leave out while a misspelt key is still rejected.
    ConfigStore.instance().store(name=BASE_CONFIG, node=to_dict(AppConfig()))
    try:
        with initialize_config_dir(config_dir=str(CONF_DIR), version_base="1.3",
                                   job_name="rlinf-embodied"):
            return compose(config_name="config", overrides=list(overrides))
    except (HydraException, OmegaConfBaseException) as exc:
        explained = _split_value(overrides) or _explain(overrides)
        if explained is not None:
            raise explained from exc
        groups = "; ".join(f"{g}: {', '.join(_group_options(g))}" for g in ("task", "placement"))
        raise ConfigError(f"cannot compose the config with overrides {list(overrides)}: "
                          f"{str(exc).strip()} (config groups: {groups}; keys: "
                          "rlinf-embodied --help)") from exc


def _flat(data: dict[str, Any], prefix: str = "") -> dict[str, Any]:
    out: dict[str, Any] = {}
    for key, value in data.items():
        if isinstance(value, dict):
            out |= _flat(value, f"{prefix}{key}.")
        else:
            out[f"{prefix}{key}"] = value
    return out


def _help_text() -> str:
    defaults = _flat(to_dict(from_omegaconf(compose_config())))
    lines = [__doc__.strip() if __doc__ else "", "", "Config groups:"]
    for group in ("task", "placement"):
        lines.append(f"  {group}=" + "|".join(_group_options(group)))
    lines += ["", "Config keys (key=value; the value shown is the default config's: "
              "task=inverted_double_pendulum, placement=collocated). A value with commas or spaces "
              "needs quotes for the shell and for Hydra, e.g. "
              "\"placement.spec='env: 0, rollout: 1, actor: 0-1'\":"]
    for key, type_name, _default, doc in describe_fields(AppConfig):
        lines.append(f"  {key}={defaults.get(key)!r}  ({type_name})")
        if doc:
            lines.append(f"      {doc}")
    return "\n".join(lines)


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="rlinf-embodied", add_help=False,
        formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("overrides", nargs="*", help="Hydra overrides, key=value")
    parser.add_argument("-h", "--help", action="store_true", help="show keys and exit")
    parser.add_argument("--dry-run", action="store_true",
                        help="print the resolved config and the execution plan, then exit")
    parser.add_argument("--run-dir", type=Path, default=None, help="overrides run.run_dir")
    parser.add_argument("--resume", action="store_true",
                        help="continue from the latest checkpoint in the run dir")
    parser.add_argument("--check-target", action="store_true",
                        help=f"exit with status {EXIT_TARGET_MISSED} when the trained policy "
                        "misses the task's threshold")
    parser.add_argument("--log-level", default="warning", help="structlog level of the app")
    return parser


def load_config(overrides: Sequence[str], *, run_dir: Path | None = None) -> AppConfig:
    """Compose, validate and apply `--run-dir`: the `AppConfig` of one command line."""
    cfg = from_omegaconf(compose_config(overrides))
    if run_dir is not None:
        cfg = dataclasses.replace(cfg, run=dataclasses.replace(cfg.run, run_dir=str(run_dir)))
    return cfg


def _train_with_ray_starting(cfg: AppConfig) -> Callable[..., RunSummary]:
    """`rlinf_embodied.run.train`, imported while Ray starts
    (`rlinf.workers.runtime.ray_session.import_while_ray_starts`); the first session of the
    returned `train` owns the Ray it started."""
    from rlinf.workers.runtime.ray_session import import_while_ray_starts

    run, started = import_while_ray_starts("rlinf_embodied.run", **ray_options(cfg))
    return functools.partial(run.train, ray_started=started)


def export_main(argv: Sequence[str]) -> int:
    """``rlinf-embodied export RUN_DIR [--step N] --out DIR``; returns the exit status."""
    parser = argparse.ArgumentParser(
        prog="rlinf-embodied export",
        description="Write a run's trained policy as policy.pt (its network's shape and "
                    "weights); rlinf_embodied.export.load_policy(DIR) rebuilds it.")
    parser.add_argument("run_dir", type=Path, help="the run folder (its --run-dir)")
    parser.add_argument("--step", type=int, default=None,
                        help="the checkpoint's step (default: the latest)")
    parser.add_argument("--out", type=Path, required=True, help="the folder to write")
    args = parser.parse_args(list(argv))
    from rlinf_embodied.export import export_policy

    try:
        path = export_policy(args.run_dir, args.out, step=args.step)
    except (ConfigError, MissingExtraError) as exc:
        print(f"rlinf-embodied export: error: {exc}", file=sys.stderr)
        return EXIT_CONFIG
    print(f"exported to {path}")
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the `rlinf-embodied` command; returns the exit status."""
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv[:1] == ["export"]:
        return export_main(argv[1:])
    parser = _parser()
    args = parser.parse_args(argv)
    if args.help:
        print(_help_text())
        return 0
    split = _split_value(args.overrides)
    if split is not None:
        print(f"rlinf-embodied: error: {split}", file=sys.stderr)
        return EXIT_CONFIG
    bad = [o for o in args.overrides if "=" not in o]
    if bad:
        print(f"rlinf-embodied: error: {bad[0]!r} is not an override: expected key=value "
              "(see rlinf-embodied --help)", file=sys.stderr)
        return EXIT_CONFIG
    try:
        cfg = load_config(args.overrides, run_dir=args.run_dir)
    except (ConfigError, MissingExtraError) as exc:
        print(f"rlinf-embodied: error: {exc}", file=sys.stderr)
        return EXIT_CONFIG

    from rlinf.workers.telemetry import configure_logging

    configure_logging(level=args.log_level)
    import yaml

    if args.dry_run:
        from rlinf_embodied.run import dry_run

        print(yaml.safe_dump(to_dict(cfg), sort_keys=False).rstrip())
        try:
            print(dry_run(cfg))
        except (ConfigError, MissingExtraError) as exc:
            print(f"rlinf-embodied: error: {exc}", file=sys.stderr)
            return EXIT_CONFIG
        return 0
    try:
        summary = _train_with_ray_starting(cfg)(cfg, resume=args.resume,
                                                overrides=args.overrides)
    except (CheckpointMismatchError, ConfigError, MissingExtraError) as exc:
        print(f"rlinf-embodied: error: {exc}", file=sys.stderr)
        return EXIT_CONFIG
    except WorkersError as exc:  # a worker died or timed out: what was written is kept
        print(f"rlinf-embodied: error: {exc}\nmetrics and checkpoints so far are in "
              f"{cfg.run.run_dir}; continue with: rlinf-embodied <same overrides> --run-dir "
              f"{cfg.run.run_dir} --resume", file=sys.stderr)
        return EXIT_FAILED
    except KeyboardInterrupt:  # workers are stopped by the run's cleanup; outputs are kept
        print(f"rlinf-embodied: interrupted; continue with --run-dir {cfg.run.run_dir} "
              "--resume", file=sys.stderr)
        return EXIT_INTERRUPTED
    if args.check_target and summary.target_reached is False:
        return EXIT_TARGET_MISSED
    return 0


if __name__ == "__main__":  # pragma: no cover - `python -m rlinf_embodied.cli`
    sys.exit(main())
