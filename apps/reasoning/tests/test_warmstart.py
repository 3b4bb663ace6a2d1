"""The shipped warm-start checkpoint: loads, is small, deterministic, and partly competent.

The accuracy band guards against shipping a broken checkpoint (too low: GRPO gets no
signal) or an over-trained one (too high: RL has no room to show a gain).
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import torch
from rlinf_reasoning import WARMSTART_DIR, load_warmstart
from rlinf_reasoning.evaluate import accuracy, generate
from rlinf_reasoning.warmstart import read_metadata, warmstart_task

from rlinf.envs.math import ProblemGenerator

ACCURACY_BAND = (0.15, 0.60)
"""Held-out greedy accuracy the shipped checkpoint must lie in (documented in the README)."""
MAX_CHECKPOINT_BYTES = 5 * 1024 * 1024


def test_checkpoint_is_small() -> None:
    total = sum(p.stat().st_size for p in WARMSTART_DIR.iterdir() if p.is_file())
    assert 0 < total <= MAX_CHECKPOINT_BYTES, f"checkpoint is {total} bytes"


def test_loads_with_tokenizer_ids_in_model() -> None:
    model, tokenizer = load_warmstart()
    assert not model.training
    assert model.generation_config.eos_token_id == tokenizer.eos_token_id
    assert model.generation_config.pad_token_id == tokenizer.pad_token_id
    assert model.get_output_embeddings().weight is model.get_input_embeddings().weight


def test_greedy_decoding_is_deterministic_and_numeric() -> None:
    prompts = ["12+7=", "57-83=", "5+5=", "99-1="]
    torch.set_num_threads(1)
    first, tokenizer = load_warmstart()
    second, _ = load_warmstart()
    _, _, a = generate(first, tokenizer, prompts, max_new_tokens=6, do_sample=False)
    _, _, b = generate(second, tokenizer, prompts, max_new_tokens=6, do_sample=False)
    assert torch.equal(a, b)
    for text in tokenizer.batch_decode(a, skip_special_tokens=True):
        assert text.lstrip("-").isdigit(), f"expected a number, got {text!r}"
    for row in a:  # each response ends with EOS within the limit
        assert tokenizer.eos_token_id in row.tolist()


def test_heldout_greedy_accuracy_in_band() -> None:
    torch.set_num_threads(1)
    model, tokenizer = load_warmstart()
    problems = ProblemGenerator(warmstart_task()).generate(200, split="heldout", unique=True)
    measured = accuracy(model, tokenizer, problems)
    low, high = ACCURACY_BAND
    assert low <= measured <= high, f"held-out greedy accuracy {measured} outside {ACCURACY_BAND}"


def test_metadata_records_its_accuracy() -> None:
    meta = read_metadata()
    low, high = ACCURACY_BAND
    assert low <= meta["heldout_accuracy"]["greedy"] <= high
    assert meta["template"] == "short"


def test_headroom_script_runs_with_a_tiny_budget() -> None:
    script = Path(__file__).resolve().parents[1] / "scripts" / "check_rl_headroom.py"
    result = subprocess.run(
        [sys.executable, str(script), "--steps", "2", "--prompts-per-step", "4",
         "--eval-every", "1", "--eval-problems", "16"],
        capture_output=True, text=True, timeout=300, check=False,
    )
    assert result.returncode == 0, result.stderr[-2000:]
    assert "held-out greedy accuracy" in result.stdout
