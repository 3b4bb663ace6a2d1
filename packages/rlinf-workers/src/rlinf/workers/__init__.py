"""rlinf.workers — the worker runtime on Ray and the RL algorithms its workers share.

Importing this package is cheap: it loads only the error types. The parts live in
subpackages, imported when used:

- `rlinf.workers.algorithms`: GAE, discounted returns, GRPO advantages, PPO policy and value
  losses, entropy, KL estimators, loss aggregation, masked statistics (pure torch functions).
- `rlinf.workers.models`: tiny Qwen2-style causal LMs built from a config, a char-level
  arithmetic tokenizer, MLP/CNN actor-critics, and the shared response log-prob function.
- `rlinf.workers.runtime`: `Worker` (a Ray actor base) and `WorkerGroup` (launch N ranks,
  fan calls out with typed split/gather specs, dead ranks surface as `WorkerDiedError`).
"""

from rlinf.workers.errors import (
    ConfigError,
    DispatchError,
    GroupClosedError,
    MissingExtraError,
    ShapeError,
    WorkerCallError,
    WorkerDiedError,
    WorkersError,
    WorkerTimeoutError,
)
from rlinf.workers.version import __version__

__all__ = [
    "ConfigError",
    "DispatchError",
    "GroupClosedError",
    "MissingExtraError",
    "ShapeError",
    "WorkerCallError",
    "WorkerDiedError",
    "WorkerTimeoutError",
    "WorkersError",
    "__version__",
]
