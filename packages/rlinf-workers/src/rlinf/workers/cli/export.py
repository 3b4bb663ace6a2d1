"""`ExportCommand`: ``<prog> export RUN_DIR [--step N] --out DIR [flags]``, a run's
checkpoint written in a form its users load, in one layout for every app."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from rlinf.workers.errors import ConfigError, MissingExtraError

__all__ = ["ExportCommand"]


@dataclass(frozen=True)
class ExportCommand:
    """The export subcommand of an app (module docstring)."""

    description: str
    """What the command writes, for its ``--help``."""
    write: Callable[..., Path]
    """``write(run_dir, out, step=, **flags) -> the folder or file written``; raises a
    `ConfigError` (or `MissingExtraError`) that says what to change."""
    flags: Mapping[str, str] = field(default_factory=dict)
    """The app's own on/off flags (name without dashes → help), passed to `write`."""

    def main(self, prog: str, argv: Sequence[str]) -> int:
        """Parse `argv` (after ``export``), write, and return the exit status (2 for a
        refusal, with one line saying why)."""
        from rlinf.workers.cli.app import EXIT_CONFIG

        parser = argparse.ArgumentParser(prog=f"{prog} export", description=self.description)
        parser.add_argument("run_dir", type=Path, help="the run folder (its --run-dir)")
        parser.add_argument("--step", type=int, default=None,
                            help="the checkpoint's step (default: the latest)")
        parser.add_argument("--out", type=Path, required=True, help="the folder to write")
        for name, text in self.flags.items():
            parser.add_argument(f"--{name}", action="store_true", help=text)
        args = parser.parse_args(list(argv))
        flags = {name: getattr(args, name) for name in self.flags}
        try:
            out = self.write(args.run_dir, args.out, step=args.step, **flags)
        except (ConfigError, MissingExtraError) as exc:
            print(f"{prog} export: config error: {exc}", file=sys.stderr)
            return EXIT_CONFIG
        print(f"exported to {out}")
        return 0
