"""rlinf.envs — tasks for RL training: math problems and vectorized simulators.

Import the task families from their subpackages: `rlinf.envs.math` (problems, datasets,
generator, extraction, verification, rewards) and `rlinf.envs.embodied` (vectorized
simulators). This top level only holds the version and the error types.
"""

from rlinf.envs.errors import (
    AssetsMissingError,
    ConfigError,
    DatasetError,
    DatasetNotFoundError,
    DatasetRecordError,
    EnvProcessError,
    EnvsError,
    EnvStepError,
    GeneratorError,
    MissingExtraError,
    RenderError,
    UnknownEnvError,
    VerifierError,
)
from rlinf.envs.version import __version__

__all__ = [
    "AssetsMissingError",
    "ConfigError",
    "DatasetError",
    "DatasetNotFoundError",
    "DatasetRecordError",
    "EnvProcessError",
    "EnvStepError",
    "EnvsError",
    "GeneratorError",
    "MissingExtraError",
    "RenderError",
    "UnknownEnvError",
    "VerifierError",
    "__version__",
]
