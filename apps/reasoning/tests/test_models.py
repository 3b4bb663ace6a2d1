"""Where the policy comes from: the tokenizer factory gives the model factory's tokenizer
without the model, and a process that only unpickles the factories (every role's) does not
import transformers' modeling code."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
from rlinf_reasoning.models import model_factory, tokenizer_factory
from rlinf_reasoning.spec import FlowSpec

from rlinf.workers.models import TinyLMConfig, build_tiny_model


@pytest.mark.parametrize("source", ["warm start", "tiny model", "hugging face folder"])
def test_the_tokenizer_factory_gives_the_model_factorys_tokenizer(tmp_path: Path,
                                                                  source: str) -> None:
    if source == "warm start":
        spec = FlowSpec()
    elif source == "tiny model":
        spec = FlowSpec(model_config=TinyLMConfig(hidden_size=64, num_layers=1))
    else:
        model, tokenizer = build_tiny_model(TinyLMConfig(hidden_size=64, num_layers=1), seed=0)
        model.save_pretrained(tmp_path)
        tokenizer.save_pretrained(tmp_path)
        spec = FlowSpec(model_dir=tmp_path)
    _, expected = model_factory(spec)()
    got = tokenizer_factory(spec)()
    assert got.get_vocab() == expected.get_vocab()
    assert (got.pad_token_id, got.eos_token_id) == (expected.pad_token_id, expected.eos_token_id)
    text = "12+30=42"
    assert got(text)["input_ids"] == expected(text)["input_ids"]


def test_unpickling_the_factories_and_loading_the_tokenizer_skips_the_modeling_code() -> None:
    probe = (
        "import pickle, sys\n"
        "from rlinf_reasoning.models import model_factory, tokenizer_factory\n"
        "from rlinf_reasoning.spec import FlowSpec\n"
        "spec = FlowSpec()\n"
        "blob = pickle.dumps((model_factory(spec), tokenizer_factory(spec)))\n"
        "_, tokens = pickle.loads(blob)\n"
        "tokens()\n"
        "print('modeling' if 'transformers.modeling_utils' in sys.modules else 'none')\n"
    )
    out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True,
                         timeout=120, check=True).stdout
    assert out.strip().splitlines()[-1] == "none"
