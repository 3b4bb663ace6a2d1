"""What the Megatron actor refuses, each before anything is built, with a message that says
what to do instead."""

from __future__ import annotations

import sys

import pytest

from rlinf.workers.actor.megatron import MegatronConfig
from rlinf.workers.actor.megatron.model import initialize_parallel, require_megatron
from rlinf.workers.errors import ConfigError, MissingExtraError


def test_sequence_parallelism_without_tensor_parallelism_is_refused() -> None:
    with pytest.raises(ConfigError, match="tensor_parallel > 1"):
        MegatronConfig(sequence_parallel=True)
    assert MegatronConfig(tensor_parallel=2, sequence_parallel=True).sequence_parallel


def test_a_missing_extra_names_the_install_command(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "megatron.core", None)
    with pytest.raises(MissingExtraError, match=r"rlinf-workers\[megatron\]"):
        require_megatron()


def test_a_cut_without_a_process_group_is_refused() -> None:
    pytest.importorskip("megatron.core", reason="needs the megatron extra")
    import torch.distributed as dist

    assert not dist.is_initialized()
    with pytest.raises(ConfigError, match="init_process_group"):
        initialize_parallel(MegatronConfig(), seed=0)
