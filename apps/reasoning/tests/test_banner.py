"""The banner a run prints first: what model, tokenizer and problems it loaded."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from rlinf_reasoning.banner import describe_loaded
from rlinf_reasoning.config import ReasoningConfig, from_omegaconf
from rlinf_reasoning.data import problem_source
from rlinf_reasoning.errors import InvalidConfigError
from rlinf_reasoning.spec import flow_spec

from rlinf.envs.math import MathProblem, save_jsonl
from rlinf.workers.models import TinyLMConfig, build_tiny_model


def _cfg(**sections: dict[str, object]) -> ReasoningConfig:
    return from_omegaconf(dict(sections), num_devices=2)


def test_default_run_names_the_warm_start_and_generated_problems() -> None:
    cfg = _cfg()
    spec = flow_spec(cfg)
    loaded = describe_loaded(cfg, spec, problem_source(cfg))
    model, tokenizer = spec.model.model_factory()()
    assert loaded.parameters == sum(p.numel() for p in model.parameters())
    assert loaded.train_problems is None and loaded.heldout_problems == cfg.data.heldout_size
    model_line, tokenizer_line, data_line, prompt_line = loaded.lines()
    assert model_line.startswith("model: warm start ") and "trains in fp32" in model_line
    assert f"vocabulary {len(tokenizer)}" in tokenizer_line
    assert data_line == (f"data: generated level {cfg.data.level} — generated on the fly, "
                         f"{cfg.data.heldout_size} held-out")
    first = problem_source(cfg)(1, 1)[0]  # the short template: the compact form, one "="
    assert prompt_line == f"first prompt: {first.metadata['compact']!r}"


def test_the_first_prompt_is_printed_as_the_chat_template_renders_it(tmp_path: Path) -> None:
    model, tokenizer = build_tiny_model(TinyLMConfig(hidden_size=64, num_layers=1), seed=0)
    tokenizer.chat_template = ("{% for m in messages %}<{{ m['role'] }}>{{ m['content'] }}"
                               "{% endfor %}{% if add_generation_prompt %}<assistant>{% endif %}")
    model.save_pretrained(tmp_path / "model")
    tokenizer.save_pretrained(tmp_path / "model")
    # The tiny char tokenizer has no space: the line shows what it keeps, as the model sees.
    for system, shown in (("Be brief.", "<system>Bebrief.<user>"), (None, "'<user>")):
        cfg = _cfg(model={"dir": str(tmp_path / "model")},
                   data={"template": "chat", "system_prompt": system})
        source = problem_source(cfg)
        line = describe_loaded(cfg, flow_spec(cfg), source).lines()[3]
        question = source(1, 1)[0].question.strip().replace(" ", "")
        assert line.startswith("first prompt: ") and shown in line
        assert line.endswith(f"{question}<assistant>'")


def test_a_hugging_face_folder_is_counted_without_reading_its_weights(tmp_path: Path) -> None:
    model, tokenizer = build_tiny_model(TinyLMConfig(hidden_size=64, num_layers=3), seed=0)
    model.to(torch.bfloat16).save_pretrained(tmp_path / "model")
    tokenizer.save_pretrained(tmp_path / "model")
    problems = [MathProblem(f"What is {i} + 1?", str(i + 1)) for i in range(200)]
    save_jsonl(problems, tmp_path / "problems.jsonl")
    cfg = _cfg(model={"dir": str(tmp_path / "model")},
               data={"path": str(tmp_path / "problems.jsonl"), "heldout_size": 50})
    source = problem_source(cfg)
    loaded = describe_loaded(cfg, flow_spec(cfg), source)
    assert loaded.parameters == sum(p.numel() for p in model.parameters())
    assert loaded.stored_dtype == "bfloat16"
    assert loaded.train_problems is not None
    assert loaded.train_problems + len(source.heldout) == 200
    assert loaded.model == str(tmp_path / "model")
    assert f"{loaded.train_problems} train, {len(source.heldout)} held-out" in loaded.lines()[2]


def test_chat_template_without_one_in_the_tokenizer_is_refused_before_launch() -> None:
    cfg = _cfg(data={"template": "chat"})
    with pytest.raises(InvalidConfigError, match=r"data\.template.*no chat template"):
        describe_loaded(cfg, flow_spec(cfg), problem_source(cfg))


def _cache_with(tmp_path: Path, repo_id: str) -> Path:
    """A Hugging Face cache holding one snapshot of a tiny model as `repo_id`."""
    org, name = repo_id.split("/")
    repo = tmp_path / "hub" / f"models--{org}--{name}"
    commit = "0123456789abcdef0123456789abcdef01234567"
    model, tokenizer = build_tiny_model(TinyLMConfig(hidden_size=32, num_layers=1), seed=0)
    model.save_pretrained(repo / "snapshots" / commit)
    tokenizer.save_pretrained(repo / "snapshots" / commit)
    (repo / "refs").mkdir()
    (repo / "refs" / "main").write_text(commit)
    return tmp_path / "hub"


def test_a_hub_id_resolves_from_the_local_cache(tmp_path: Path,
                                                monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HF_HUB_CACHE", str(_cache_with(tmp_path, "acme/tiny-math")))
    cfg = _cfg(model={"dir": "acme/tiny-math"})
    spec = flow_spec(cfg)
    assert spec.model.dir is not None and spec.model.dir.parts[-2:-1] == ("snapshots",)
    assert (spec.model.dir / "config.json").is_file()
    loaded = describe_loaded(cfg, spec, problem_source(cfg))
    assert loaded.model == str(spec.model.dir) and loaded.parameters > 0


def test_a_hub_id_not_in_the_cache_says_how_to_download_it(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "empty"))
    with pytest.raises(InvalidConfigError, match=r"hf download acme/absent"):
        _cfg(model={"dir": "acme/absent"})
