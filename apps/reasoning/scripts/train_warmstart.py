"""Train the warm-start checkpoint that rlinf-reasoning ships (supervised, on CPU).

What it does: builds the tiny Qwen2-style model (`TinyLMConfig`, no download) and the char
tokenizer, then trains it with plain next-token cross-entropy on generated arithmetic in the
short template — prompt "12+7=", target "19<eos>", loss on the target only. It stops early
on purpose: the app's GRPO run starts from a model that is right on some problems and wrong
on others, so sampled groups carry signal and RL has room to improve it.

Where it stops is chosen on a validation split of its own, never on the held-out (test)
split the app reports its before/after accuracy on. The problem space is cut by a hash of
each problem: 10% held out (the app's test split), 10% validation, 80% training
(`GeneratorConfig.validation_fraction`). Every `eval_every` steps the script measures greedy
accuracy on `eval_problems` distinct validation problems and stops at the first check at or
above `target_accuracy`. Only then is the held-out accuracy measured, once, and recorded.
It writes into `out_dir`: ``model.safetensors``, ``warmstart.json`` (model config, task
config, these settings, the validation curve that chose the stop, the validation and the
held-out accuracy) and ``tokenizer.json`` + ``tokenizer_config.json``.

With ``--tools`` it trains the tool-calling warm start of ``task=math_tools`` instead
(written to ``assets/warmstart_tools``): the target is the calculator call, the tool's
answer (not learned: the tool writes it) and the final answer,
``<calculator>12+7</calculator><result>19</result>19<eos>``, and validation runs the
model through the tool loop with the real calculator (`tool_accuracy`). The shipped one:
``train_warmstart.py --tools --target-accuracy 0.3 --eval-every 10`` (copying the
expression is learned abruptly, so the checks are closer together).

Task: `GeneratorConfig.for_level(2)` — two operands of 1-2 digits, + and -, negative answers
allowed ("57-83=" → "-26").

Deterministic: seeded model init, seeded problem streams, greedy validation, one torch
thread. The same command writes the same weights on the same torch build.

Run (from the repository root; about 2 minutes on one thread of a shared 2-core machine)::

    .venv/bin/python apps/reasoning/scripts/train_warmstart.py

The figures it reached are in ``warmstart.json`` and in the app's README.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import structlog
import torch
from rlinf_reasoning.warmstart import (
    METADATA_FILE,
    TOOLS_WARMSTART_DIR,
    WARMSTART_DIR,
    WEIGHTS_FILE,
)
from safetensors.torch import save_file
from transformers import PreTrainedTokenizerBase

from rlinf.envs import ConfigError
from rlinf.envs.math import GeneratorConfig, MathProblem, ProblemGenerator, format_prompt
from rlinf.workers.models import TinyLMConfig, build_char_tokenizer, build_tiny_causal_lm
from rlinf.workers.reasoning.accuracy import accuracy, tool_accuracy, tool_target

log = structlog.get_logger("train_warmstart")


@dataclass(frozen=True)
class TrainConfig:
    """Settings of the warm-start run; each is a command-line flag."""

    level: int = 2
    """Difficulty preset of the problem generator (`GeneratorConfig.for_level`)."""
    task_seed: int = 0
    """Seed of the problem streams."""
    model_seed: int = 0
    """Seed of the model's initial weights."""
    hidden_size: int = 128
    """Width of the model."""
    num_layers: int = 2
    """Decoder layers."""
    intermediate_size: int = 512
    """MLP width."""
    target_accuracy: float = 0.30
    """Validation greedy accuracy at which training stops: partly competent, with room
    for RL. The stop is the first validation check at or above it."""
    max_steps: int = 2400
    """Optimizer steps after which the run gives up if the target was never reached."""
    batch_size: int = 128
    """Problems per step."""
    lr: float = 3e-3
    """Peak AdamW learning rate (linear warm-up over `warmup_steps`, then constant)."""
    warmup_steps: int = 20
    """Steps of linear learning-rate warm-up."""
    weight_decay: float = 0.0
    """AdamW weight decay."""
    eval_every: int = 50
    """Validation check every this many steps."""
    eval_problems: int = 400
    """Distinct problems of each validation check, and of the final held-out measurement."""
    validation_fraction: float = 0.1
    """Share of the problem space kept for validation (apart from training and held-out)."""
    threads: int = 1
    """torch CPU threads (the machines are shared)."""
    out_dir: str = ""
    """Where the checkpoint is written (empty: the app's warm-start folder, or its
    tool-calling one with --tools)."""
    tools: bool = False
    """Train the tool-calling warm start (module docstring)."""


def parse_args(argv: list[str] | None = None) -> TrainConfig:
    """`TrainConfig` from the command line; `--help` lists every field with its default."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    for field in dataclasses.fields(TrainConfig):
        flag = f"--{field.name.replace('_', '-')}"
        if isinstance(field.default, bool):
            parser.add_argument(flag, action=argparse.BooleanOptionalAction,
                                default=field.default)
        else:
            parser.add_argument(flag, type=type(field.default), default=field.default)
    cfg = TrainConfig(**vars(parser.parse_args(argv)))
    if not cfg.out_dir:
        cfg = dataclasses.replace(
            cfg, out_dir=str(TOOLS_WARMSTART_DIR if cfg.tools else WARMSTART_DIR))
    if not 0.0 < cfg.target_accuracy <= 1.0:
        parser.error(f"--target-accuracy must be in (0, 1], got {cfg.target_accuracy}")
    if cfg.eval_every < 1 or cfg.max_steps < cfg.eval_every:
        parser.error(f"need 1 <= --eval-every <= --max-steps, got {cfg.eval_every}, "
                     f"{cfg.max_steps}")
    if cfg.eval_problems < 1:
        parser.error(f"--eval-problems must be >= 1, got {cfg.eval_problems}")
    try:
        task_of(cfg)
    except ConfigError as exc:  # --level, --validation-fraction
        parser.error(str(exc))
    return cfg


def task_of(cfg: TrainConfig) -> GeneratorConfig:
    """The generator config of the task: the level's preset with a validation split."""
    return dataclasses.replace(GeneratorConfig.for_level(cfg.level, seed=cfg.task_seed),
                               validation_fraction=cfg.validation_fraction)


def stop_step(curve: list[tuple[int, float]], target: float) -> int | None:
    """The first checked step whose validation accuracy reaches `target` (None: none did)."""
    return next((step for step, value in curve if value >= target), None)


def encode(
    tokenizer: PreTrainedTokenizerBase, problems: list[MathProblem], *, tools: bool = False
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """``(input_ids, attention_mask, labels)``: prompt + answer + EOS, right-padded (with
    `tools`: prompt + call + the tool's answer + answer + EOS).

    Labels are -100 on the prompt, the tool's answer and padding, so only what the model
    writes is learned.
    """
    rows, targets = [], []
    for problem in problems:
        prompt = tokenizer.encode(format_prompt(problem, template="short"))
        answer = [*tokenizer.encode(problem.answer), tokenizer.eos_token_id]
        if tools:
            call_text, result_text, _ = tool_target(problem)
            call, result = tokenizer.encode(call_text), tokenizer.encode(result_text)
            rows.append(prompt + call + result + answer)
            targets.append([-100] * len(prompt) + call + [-100] * len(result) + answer)
            continue
        rows.append(prompt + answer)
        targets.append([-100] * len(prompt) + answer)
    width = max(len(r) for r in rows)
    input_ids = torch.full((len(rows), width), tokenizer.pad_token_id)
    labels = torch.full((len(rows), width), -100)
    mask = torch.zeros((len(rows), width), dtype=torch.long)
    for i, (row, target) in enumerate(zip(rows, targets, strict=True)):
        input_ids[i, :len(row)] = torch.tensor(row)
        labels[i, :len(row)] = torch.tensor(target)
        mask[i, :len(row)] = 1
    return input_ids, mask, labels


def batches(stream: Iterator[MathProblem], size: int) -> Iterator[list[MathProblem]]:
    """Consecutive batches of `size` problems from an endless stream."""
    while True:
        yield [next(stream) for _ in range(size)]


def main(cfg: TrainConfig) -> int:
    """Train until validation reaches the target, measure held-out once, write the checkpoint."""
    torch.set_num_threads(cfg.threads)
    task = task_of(cfg)
    generator = ProblemGenerator(task)
    validation = generator.generate(cfg.eval_problems, split="validation", unique=True)
    tokenizer = build_char_tokenizer()
    model_config = TinyLMConfig(hidden_size=cfg.hidden_size, num_layers=cfg.num_layers,
                                intermediate_size=cfg.intermediate_size)
    model = build_tiny_causal_lm(model_config, seed=cfg.model_seed, tokenizer=tokenizer)
    optimizer = torch.optim.AdamW(model.parameters(), lr=cfg.lr, weight_decay=cfg.weight_decay)
    schedule = torch.optim.lr_scheduler.LambdaLR(
        optimizer, lambda step: min(1.0, (step + 1) / max(cfg.warmup_steps, 1)))
    log.info("start", params=sum(p.numel() for p in model.parameters()), task=str(task))

    def measure(model: torch.nn.Module, tokenizer: PreTrainedTokenizerBase,
                problems: list[MathProblem]) -> float:
        if cfg.tools:
            return tool_accuracy(model, tokenizer, problems).accuracy  # type: ignore[arg-type]
        return accuracy(model, tokenizer, problems)  # type: ignore[arg-type]

    start = time.monotonic()
    curve: list[tuple[int, float]] = []
    stream = batches(generator.stream(split="train"), cfg.batch_size)
    for step in range(1, cfg.max_steps + 1):
        model.train()
        input_ids, mask, labels = encode(tokenizer, next(stream), tools=cfg.tools)
        loss = model(input_ids=input_ids, attention_mask=mask, labels=labels).loss
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        schedule.step()
        if step % 25 == 0:
            log.info("train", step=step, loss=round(loss.item(), 4))
        if step % cfg.eval_every == 0:
            model.eval()
            curve.append((step, measure(model, tokenizer, validation)))
            log.info("validation", step=step, greedy=curve[-1][1],
                     elapsed_s=round(time.monotonic() - start, 1))
            if curve[-1][1] >= cfg.target_accuracy:
                break
    stopped = stop_step(curve, cfg.target_accuracy)
    if stopped is None:
        best = max(value for _, value in curve)
        log.error("target_not_reached", target=cfg.target_accuracy, max_steps=cfg.max_steps,
                  best=best)
        print(f"validation greedy accuracy never reached {cfg.target_accuracy} within "
              f"{cfg.max_steps} steps (best {best:.3f}); raise "
              "--max-steps or --lr, or lower --target-accuracy", file=sys.stderr)
        return 1
    train_s = time.monotonic() - start

    # Measured once, after the stop is fixed: the held-out split never chooses anything.
    model.eval()
    heldout = generator.generate(cfg.eval_problems, split="heldout", unique=True)
    torch.manual_seed(cfg.model_seed)  # the sampled accuracy is reproducible too
    if cfg.tools:
        used = tool_accuracy(model, tokenizer, heldout)
        test = {"greedy": used.accuracy, "calls_per_answer": used.calls_per_answer,
                "tool_error_rate": used.error_rate}
    else:
        test = {"greedy": accuracy(model, tokenizer, heldout),
                "sampled": accuracy(model, tokenizer, heldout, do_sample=True)}

    out = Path(cfg.out_dir)
    out.mkdir(parents=True, exist_ok=True)
    # Tied embeddings: store the input embedding once, leave the (shared) head out.
    state = {k: v.detach().contiguous() for k, v in model.state_dict().items()
             if not (model_config.tie_word_embeddings and k == "lm_head.weight")}
    save_file(state, str(out / WEIGHTS_FILE))
    tokenizer.save_pretrained(str(out))
    metadata = {
        "model": dataclasses.asdict(model_config),
        "task": dataclasses.asdict(task),
        "template": "short",
        "train": dataclasses.asdict(cfg) | {"out_dir": None},
        "selection": {
            "rule": "first validation check with greedy accuracy >= target_accuracy",
            "stopped_at_step": stopped,
            "validation_curve": [[s, v] for s, v in curve],
        },
        "validation_accuracy": {"greedy": curve[-1][1], "problems": cfg.eval_problems},
        "heldout_accuracy": {**test, "problems": cfg.eval_problems,
                             "max_new_tokens": 32 if cfg.tools else 6},
        **({"tools": {"format": "tags", "names": ["calculator"], "max_turns": 2}}
           if cfg.tools else {}),
        "train_seconds": round(train_s, 1),
        "torch": torch.__version__,
    }
    (out / METADATA_FILE).write_text(json.dumps(metadata, indent=2) + "\n")
    log.info("written", out=str(out), step=stopped, validation=curve[-1][1], **test,
             train_s=round(train_s, 1))
    return 0


if __name__ == "__main__":
    sys.exit(main(parse_args()))
