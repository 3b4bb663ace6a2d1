"""Typed errors of rlinf.envs: one root, subclasses that also inherit the matching builtin."""

from __future__ import annotations


class EnvsError(Exception):
    """Root of every error raised by rlinf.envs."""


class MissingExtraError(EnvsError, ImportError):
    """A feature needs an optional dependency that is not installed; the message names the extra."""

    def __init__(self, feature: str, extra: str, module: str, install: str | None = None) -> None:
        self.install = install or f"pip install 'rlinf-envs[{extra}]'"
        """The command that installs what is missing."""
        super().__init__(
            f"{feature} needs the optional module {module!r}, which is not installed; "
            f"install it with: {self.install}"
        )
        self.feature = feature
        self.extra = extra
        self.module = module

    def __reduce__(self) -> tuple[type[MissingExtraError], tuple[str, str, str, str]]:
        # Keeps the error picklable across Ray/multiprocessing despite the custom __init__.
        return (type(self), (self.feature, self.extra, self.module, self.install))


class UnknownEnvError(EnvsError, KeyError):
    """An environment name is not known to the requested backend."""

    def __str__(self) -> str:
        # KeyError.__str__ would repr() the message and wrap it in quotes.
        return str(self.args[0]) if self.args else ""


class ConfigError(EnvsError, ValueError):
    """An option has a value outside the set or range it accepts."""


class DatasetError(EnvsError, ValueError):
    """A dataset file is missing, unreadable, or its records lack the expected fields."""


class DatasetNotFoundError(DatasetError, FileNotFoundError):
    """A dataset file does not exist (or is not a regular file)."""


class DatasetRecordError(DatasetError):
    """One record of a dataset file is not a JSON object or lacks the keys of its layout."""

    def __init__(self, path: str, line: int, reason: str) -> None:
        super().__init__(f"{path}:{line}: {reason}")
        self.path = path
        self.line = line
        """1-based line of a JSONL file, or row of a Parquet file."""
        self.reason = reason

    def __reduce__(self) -> tuple[type[DatasetRecordError], tuple[str, int, str]]:
        return (type(self), (self.path, self.line, self.reason))


class GeneratorError(EnvsError, ValueError):
    """The procedural problem generator got an impossible configuration or ran out of problems."""


class EnvStepError(EnvsError, ValueError):
    """A vectorized env got actions or indices of the wrong shape, or was used out of order."""


class AssetsMissingError(EnvsError, FileNotFoundError):
    """A simulator's data files (scenes, meshes) are missing; the message says how to get them."""


class RenderError(EnvsError, RuntimeError):
    """Offscreen rendering is unavailable (no headless GL) or the env was not built to render."""


class EnvProcessError(EnvsError, RuntimeError):
    """An env worker process died or failed; the message names it, its exit code and envs."""


class VerifierError(EnvsError, RuntimeError):
    """The math verifier's helper process did not start, or math-verify failed on an answer."""
