"""Where the policy comes from (`ModelSource`): each kind of source gives the same model
and tokenizer through its factories, counts itself without loading a Hugging Face folder's
weights, hands engines a folder, and a process that only unpickles the factories (every
role's) does not import transformers' modeling code."""

from __future__ import annotations

import dataclasses
import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from safetensors.torch import save_file

from rlinf.workers.errors import ConfigError
from rlinf.workers.models import TinyLMConfig, build_tiny_model
from rlinf.workers.models.sources import ModelSource
from rlinf.workers.models.warmstart import METADATA_FILE, WEIGHTS_FILE, WarmstartError

TINY = TinyLMConfig(hidden_size=64, num_layers=1)


def _warm_start(folder: Path) -> Path:
    """A warm-start folder as the app's training script writes one (no task metadata)."""
    model, tokenizer = build_tiny_model(TINY, seed=3)
    state = {k: v for k, v in model.state_dict().items() if k != "lm_head.weight"}
    save_file(state, str(folder / WEIGHTS_FILE))
    tokenizer.save_pretrained(folder)
    (folder / METADATA_FILE).write_text(json.dumps({"model": dataclasses.asdict(TINY)}))
    return folder


def _hf_folder(folder: Path) -> Path:
    model, tokenizer = build_tiny_model(TINY, seed=5)
    model.save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    return folder


@pytest.fixture(params=["warm start", "tiny model", "hugging face folder"])
def source(request: pytest.FixtureRequest, tmp_path: Path) -> ModelSource:
    if request.param == "warm start":
        return ModelSource(_warm_start(tmp_path))
    if request.param == "tiny model":
        return ModelSource(config=TINY, seed=3)
    return ModelSource(_hf_folder(tmp_path))


def test_the_tokenizer_factory_gives_the_model_factorys_tokenizer(source: ModelSource) -> None:
    _, expected = source.model_factory()()
    got = source.tokenizer_factory()()
    assert got.get_vocab() == expected.get_vocab()
    assert (got.pad_token_id, got.eos_token_id) == (expected.pad_token_id, expected.eos_token_id)
    assert got("12+30=42")["input_ids"] == expected("12+30=42")["input_ids"]


def test_facts_count_the_model_the_factory_builds(source: ModelSource) -> None:
    model, _ = source.model_factory()()
    facts = source.facts()
    assert facts.parameters == sum(p.numel() for p in model.parameters())
    assert facts.stored_dtype == "float32"
    assert [p.shape for p in source.structure().parameters()] == \
        [p.shape for p in model.parameters()]


def test_a_warm_start_loads_its_stored_weights(tmp_path: Path) -> None:
    folder = _warm_start(tmp_path)
    loaded, _ = ModelSource(folder).model_factory()()
    built, _ = build_tiny_model(TINY, seed=3)
    for (name, a), b in zip(loaded.state_dict().items(), built.state_dict().values(),
                            strict=True):
        assert torch.equal(a, b), name
    assert ModelSource(folder).facts().where == f"warm start {folder}"


def test_engines_get_a_folder_exported_only_when_the_source_has_none(tmp_path: Path) -> None:
    hf = ModelSource(_hf_folder(tmp_path / "hf"))
    assert hf.engine_folder("hf") == (None, None)
    assert hf.engine_folder("vllm") == (str(hf.dir), None)
    path, exported = ModelSource(config=TINY).engine_folder("vllm")
    assert exported is not None and path is not None
    try:
        assert (Path(path) / "config.json").is_file()
    finally:
        exported.cleanup()


def test_a_source_takes_one_of_folder_and_config_and_a_folder_must_hold_a_model(
        tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="exactly one"):
        ModelSource(tmp_path, config=TINY)
    with pytest.raises(ConfigError, match=r"neither warmstart\.json"):
        ModelSource(tmp_path).model_factory()()
    (tmp_path / METADATA_FILE).write_text("{}")
    with pytest.raises(WarmstartError):
        ModelSource(tmp_path).facts()


def test_unpickling_the_factories_and_loading_the_tokenizer_skips_the_modeling_code(
        tmp_path: Path) -> None:
    folder = _warm_start(tmp_path)
    probe = (
        "import pickle, sys\n"
        "from pathlib import Path\n"
        "from rlinf.workers.models.sources import ModelSource\n"
        f"source = ModelSource(Path({str(folder)!r}))\n"
        "blob = pickle.dumps((source.model_factory(), source.tokenizer_factory()))\n"
        "_, tokens = pickle.loads(blob)\n"
        "tokens()\n"
        "print('modeling' if 'transformers.modeling_utils' in sys.modules else 'none')\n"
    )
    out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True,
                         timeout=120, check=True).stdout
    assert out.strip().splitlines()[-1] == "none"
