"""The apps' shared command line: `AppCLI` (flags, help in one layout, Hydra composition with
one-line errors, ``--config-dir``/``--config-name``, ``-m`` sweeps, dry runs, exit statuses),
`ExportCommand`, `sweep_jobs` and the typed errors of a command line. Hydra (the ``cli``
extra) is imported when a command line is read, never by a worker."""

from rlinf.workers.cli.app import EXIT_CONFIG, EXIT_FAILED, EXIT_INTERRUPTED, AppCLI
from rlinf.workers.cli.errors import NotAnOverrideError, UnknownKeyError, UnquotedValueError
from rlinf.workers.cli.export import ExportCommand
from rlinf.workers.cli.sweep import SweepJob, expand_sweep, sweep_jobs

__all__ = [
    "EXIT_CONFIG",
    "EXIT_FAILED",
    "EXIT_INTERRUPTED",
    "AppCLI",
    "ExportCommand",
    "NotAnOverrideError",
    "SweepJob",
    "UnknownKeyError",
    "UnquotedValueError",
    "expand_sweep",
    "sweep_jobs",
]
