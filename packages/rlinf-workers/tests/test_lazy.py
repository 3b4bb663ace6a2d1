"""`rlinf.workers._lazy`: what a flow's worker processes import, and the lazy names."""

from __future__ import annotations

import subprocess
import sys

import pytest

from rlinf.workers import models, reasoning, rollout


def _loaded_after(statement: str, modules: tuple[str, ...]) -> list[str]:
    """Which of `modules` a fresh interpreter has loaded after running `statement`."""
    probe = (f"import sys\n{statement}\n"
             f"print(','.join(m for m in {modules!r} if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True,
                         check=True, timeout=120).stdout.strip()
    return [m for m in out.split(",") if m]


@pytest.mark.parametrize("module", ["rlinf.workers.flow", "rlinf.workers.embodied.roles",
                                    "rlinf.workers.models", "rlinf.workers.rollout"])
def test_an_embodied_worker_process_does_not_load_transformers(module: str) -> None:
    assert _loaded_after(f"import {module}", ("transformers",)) == []


def test_a_reward_process_does_not_load_the_trainer() -> None:
    loaded = _loaded_after("import rlinf.workers.reasoning.reward",
                           ("rlinf.workers.actor", "rlinf.workers.reasoning.actor",
                            "rlinf.workers.models.causal_lm"))
    assert loaded == []


@pytest.mark.parametrize("role", ["rollout", "inference"])
def test_a_generator_process_does_not_load_the_trainer(role: str) -> None:
    """The adapters-only LoRA sync's merger is imported at the first sync that needs it."""
    loaded = _loaded_after(f"import rlinf.workers.reasoning.{role}",
                           ("rlinf.workers.actor", "rlinf.workers.reasoning.actor"))
    assert loaded == []


@pytest.mark.parametrize("package", [models, rollout, reasoning])
def test_every_public_name_resolves(package: object) -> None:
    for name in package.__all__:  # type: ignore[attr-defined]
        assert getattr(package, name) is not None, name


def test_an_unknown_name_is_an_attribute_error() -> None:
    with pytest.raises(AttributeError, match=r"rlinf\.workers\.models' has no attribute 'nope'"):
        models.nope  # type: ignore[attr-defined]  # noqa: B018
    assert not hasattr(rollout, "nope")
