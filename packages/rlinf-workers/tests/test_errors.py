"""Errors: builtin bases, messages naming what failed, pickling, and a light package import."""

from __future__ import annotations

import pickle
import subprocess
import sys

import pytest

from rlinf.workers import errors
from rlinf.workers._extras import require


@pytest.mark.parametrize(
    ("exc", "builtin"),
    [
        (errors.WorkerDiedError("actor", 1, node="n0", method="train"), RuntimeError),
        (errors.WorkerTimeoutError("rollout", [0, 2], method="generate", timeout=2.0),
         TimeoutError),
        (errors.WorkerCallError("actor", 0, method="train", detail="boom",
                                cause=ValueError("x")), RuntimeError),
        (errors.MissingExtraError("vLLM rollout", "vllm", "vllm"), ImportError),
        (errors.ShapeError("bad"), ValueError),
        (errors.ConfigError("bad"), ValueError),
        (errors.DispatchError("bad"), ValueError),
    ],
)
def test_errors_inherit_builtins_and_pickle(exc: Exception, builtin: type) -> None:
    assert isinstance(exc, errors.WorkersError)
    assert isinstance(exc, builtin)
    back = pickle.loads(pickle.dumps(exc))
    assert type(back) is type(exc)
    assert str(back) == str(exc)


def test_died_error_names_role_rank_node() -> None:
    exc = errors.WorkerDiedError("actor", 3, node="10.0.0.7", method="train_step")
    assert "'actor' rank 3" in str(exc)
    assert "10.0.0.7" in str(exc)
    assert "train_step" in str(exc)
    assert (exc.role, exc.rank, exc.node) == ("actor", 3, "10.0.0.7")


def test_require_names_the_extra() -> None:
    with pytest.raises(errors.MissingExtraError, match=r"rlinf-workers\[sglang\]"):
        require("rlinf_no_such_engine", feature="SGLang rollout", extra="sglang")
    assert require("json", feature="json", extra="none").__name__ == "json"


def test_package_import_is_light() -> None:
    code = (
        "import sys, rlinf.workers; "
        "heavy = [m for m in ('torch', 'ray', 'transformers', 'vllm') if m in sys.modules]; "
        "print(','.join(heavy))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == ""
