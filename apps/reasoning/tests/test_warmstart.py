"""The shipped warm-start checkpoint: loads, is small, deterministic, and partly competent.

The accuracy band guards against shipping a broken checkpoint (too low: GRPO gets no
signal) or an over-trained one (too high: RL has no room to show a gain). Its stop point
was chosen on a validation split of its own; the held-out split, on which the app reports
RL's gain, chose nothing.
"""

from __future__ import annotations

import importlib.util
import subprocess
import sys
from pathlib import Path
from types import ModuleType

import torch
from rlinf_reasoning import WARMSTART_DIR, load_warmstart
from rlinf_reasoning.warmstart import read_metadata, warmstart_task

from rlinf.envs.math import ProblemGenerator, split_of
from rlinf.workers.reasoning.accuracy import accuracy, generate

ACCURACY_BAND = (0.15, 0.60)
"""Held-out greedy accuracy the shipped checkpoint must lie in (documented in the README)."""
MAX_CHECKPOINT_BYTES = 5 * 1024 * 1024
SCRIPTS = Path(__file__).resolve().parents[1] / "scripts"


def _train_script() -> ModuleType:
    spec = importlib.util.spec_from_file_location("train_warmstart",
                                                  SCRIPTS / "train_warmstart.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # its dataclasses look their module up
    spec.loader.exec_module(module)
    return module


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


def test_the_stop_was_chosen_on_validation_problems_the_heldout_split_never_holds() -> None:
    meta = read_metadata()
    task = warmstart_task()
    assert task.validation_fraction > 0
    selection = meta["selection"]
    curve = [(step, value) for step, value in selection["validation_curve"]]
    target = meta["train"]["target_accuracy"]
    # the recorded stop is the rule applied to the recorded curve, and the run ended there
    assert selection["stopped_at_step"] == _train_script().stop_step(curve, target)
    assert curve[-1][0] == selection["stopped_at_step"]
    assert all(value < target for _, value in curve[:-1])
    validation = ProblemGenerator(task).generate(200, split="validation", unique=True)
    heldout = ProblemGenerator(task).generate(200, split="heldout", unique=True)
    assert not {p.question for p in validation} & {p.question for p in heldout}
    for problem in validation:  # the app's own held-out split (no validation) excludes them
        assert split_of(problem.metadata["compact"],
                        heldout_fraction=task.heldout_fraction) == "train"


def test_stop_step_is_the_first_check_at_or_above_the_target() -> None:
    stop_step = _train_script().stop_step
    assert stop_step([(50, 0.1), (100, 0.3), (150, 0.5)], 0.3) == 100
    assert stop_step([(50, 0.1), (100, 0.29)], 0.3) is None
    assert stop_step([], 0.3) is None


def test_a_target_never_reached_writes_nothing_and_says_what_to_change(tmp_path: Path) -> None:
    out = tmp_path / "ws"
    result = subprocess.run(
        [sys.executable, str(SCRIPTS / "train_warmstart.py"), "--max-steps", "2",
         "--eval-every", "1", "--eval-problems", "8", "--batch-size", "4",
         "--target-accuracy", "1.0", "--out-dir", str(out)],
        capture_output=True, text=True, timeout=300, check=False,
    )
    assert result.returncode == 1, result.stderr[-2000:]
    assert "never reached 1.0 within 2 steps" in result.stderr
    assert "--max-steps" in result.stderr
    assert not out.exists()


def test_headroom_script_runs_with_a_tiny_budget() -> None:
    script = SCRIPTS / "check_rl_headroom.py"
    result = subprocess.run(
        [sys.executable, str(script), "--steps", "2", "--prompts-per-step", "4",
         "--eval-every", "1", "--eval-problems", "16"],
        capture_output=True, text=True, timeout=300, check=False,
    )
    assert result.returncode == 0, result.stderr[-2000:]
    assert "held-out greedy accuracy" in result.stdout


def test_the_tool_calling_warm_start_calls_the_calculator_and_has_room_to_improve() -> None:
    from rlinf_reasoning.warmstart import TOOLS_WARMSTART_DIR

    from rlinf.workers.reasoning.accuracy import tool_accuracy

    total = sum(p.stat().st_size for p in TOOLS_WARMSTART_DIR.iterdir() if p.is_file())
    assert 0 < total <= MAX_CHECKPOINT_BYTES
    meta = read_metadata(TOOLS_WARMSTART_DIR)
    assert meta["tools"] == {"format": "tags", "names": ["calculator"], "max_turns": 2}
    assert meta["train"]["tools"] is True
    torch.set_num_threads(1)
    model, tokenizer = load_warmstart(path=TOOLS_WARMSTART_DIR)
    problems = ProblemGenerator(warmstart_task(TOOLS_WARMSTART_DIR)).generate(
        200, split="heldout", unique=True)
    used = tool_accuracy(model, tokenizer, problems)
    assert used.calls_per_answer > 0.9  # it has learned the format
    low, high = 0.3, 0.8  # partly competent: RL has room
    assert low <= used.accuracy <= high, used
    assert abs(used.accuracy - meta["heldout_accuracy"]["greedy"]) < 0.1


def test_train_script_writes_a_tool_calling_checkpoint(tmp_path: Path) -> None:
    script = _train_script()
    cfg = script.parse_args(["--tools", "--max-steps", "20", "--eval-every", "10",
                             "--eval-problems", "16", "--target-accuracy", "0.01",
                             "--batch-size", "16", "--out-dir", str(tmp_path)])
    assert cfg.tools and cfg.out_dir == str(tmp_path)
    input_ids, _, labels = script.encode(
        build_tokenizer(), ProblemGenerator(warmstart_task()).generate(2, split="train"),
        tools=True)
    # The tool's answer is never a target: only what the model writes is learned.
    text = build_tokenizer().decode([t for t in input_ids[0].tolist() if t])
    result = text[text.index("<result>"):text.index("</result>") + len("</result>")]
    learned = build_tokenizer().decode([t for t in labels[0].tolist() if t >= 0])
    assert result not in learned and "<calculator>" in learned
    assert script.parse_args([]).out_dir == str(WARMSTART_DIR)


def build_tokenizer():  # type: ignore[no-untyped-def]
    from rlinf.workers.models import build_char_tokenizer

    return build_char_tokenizer()
