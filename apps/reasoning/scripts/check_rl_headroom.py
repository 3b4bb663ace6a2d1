"""Check that a few minutes of GRPO on CPU lift the warm-start checkpoint's accuracy.

Evidence for the reasoning app's promise (held-out greedy accuracy rises over the shipped
checkpoint within minutes on CPU) and a reference for its author: plain
GRPO, in one process, top to bottom —

    sample `prompts_per_step` training problems
    → `generate` `group_size` responses to each at temperature 1 (HF generate)
    → reward 1/0 per response (`rlinf.envs.math.score`, last number)
    → `grpo_advantages` per group
    → old log-probs (no grad), then `ppo_epochs` passes of `ppo_policy_loss` (clipped
      surrogate, token-mean) on log-probs from `response_log_probs` → AdamW step

and held-out greedy accuracy on `eval_problems` distinct problems before, every
`eval_every` steps, and after. It stops after `steps` steps or `max_seconds`, whichever
comes first, and prints a summary line.

Run (from the repository root; about 60 s of RL alone, ~3 min sharing the 2 cores, one thread)::

    .venv/bin/python apps/reasoning/scripts/check_rl_headroom.py
    .venv/bin/python apps/reasoning/scripts/check_rl_headroom.py --seed 1

Results seen with the defaults are recorded in apps/reasoning/README.md.
"""

from __future__ import annotations

import argparse
import dataclasses
import functools
import time
from dataclasses import dataclass
from pathlib import Path

import structlog
import torch
from rlinf_reasoning.warmstart import WARMSTART_DIR, load_warmstart, warmstart_task

from rlinf.envs.math import ProblemGenerator, format_prompt
from rlinf.workers.algorithms import grpo_advantages, ppo_policy_loss
from rlinf.workers.models import response_log_probs, response_mask_from_eos
from rlinf.workers.reasoning.accuracy import accuracy, generate, rewards

log = structlog.get_logger("check_rl_headroom")


@dataclass(frozen=True)
class HeadroomConfig:
    """Settings of the GRPO check; each is a command-line flag."""

    seed: int = 0
    """Seed of torch's RNG (sampling) and of the training problem stream."""
    steps: int = 100
    """GRPO steps (one batch of rollouts each)."""
    max_seconds: float = 300.0
    """Wall-clock budget for the RL steps (evaluation included); stop early past it."""
    prompts_per_step: int = 64
    """Distinct training prompts per step."""
    group_size: int = 8
    """Responses sampled per prompt (one GRPO group)."""
    max_new_tokens: int = 6
    """Response length limit (answers are at most 3 characters plus EOS)."""
    temperature: float = 1.0
    """Sampling temperature of the rollouts."""
    lr: float = 3e-4
    """AdamW learning rate (constant)."""
    ppo_epochs: int = 1
    """Optimizer passes over each batch of rollouts."""
    clip_ratio: float = 0.2
    """PPO clip range."""
    eval_every: int = 25
    """Held-out evaluation every this many steps."""
    eval_problems: int = 400
    """Distinct problems per evaluation."""
    eval_split: str = "heldout"
    """Split evaluated: "heldout" (the test split the README reports) or "validation"
    (the warm start's own split, for choosing settings without looking at the test)."""
    threads: int = 1
    """torch CPU threads (the machines are shared)."""
    checkpoint: str = str(WARMSTART_DIR)
    """Warm-start checkpoint folder to start from."""


def parse_args() -> HeadroomConfig:
    """`HeadroomConfig` from the command line; `--help` lists every field with its default."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    for field in dataclasses.fields(HeadroomConfig):
        parser.add_argument(f"--{field.name.replace('_', '-')}", type=type(field.default),
                            default=field.default)
    cfg = HeadroomConfig(**vars(parser.parse_args()))
    if cfg.eval_split not in ("heldout", "validation"):
        parser.error(f"--eval-split must be heldout or validation, got {cfg.eval_split!r}")
    return cfg


def main(cfg: HeadroomConfig) -> dict[str, float]:
    """Run the check; returns accuracy before/after, the gain in points and the seconds."""
    torch.set_num_threads(cfg.threads)
    torch.manual_seed(cfg.seed)
    model, tokenizer = load_warmstart(path=Path(cfg.checkpoint))
    task = dataclasses.replace(warmstart_task(Path(cfg.checkpoint)), seed=cfg.seed)
    generator = ProblemGenerator(task)
    evaluated = generator.generate(cfg.eval_problems, split=cfg.eval_split,  # type: ignore[arg-type]
                                   unique=True)
    train_stream = generator.stream(split="train")
    optimizer = torch.optim.AdamW(model.parameters(), lr=cfg.lr, weight_decay=0.0)

    before = accuracy(model, tokenizer, evaluated)
    log.info(cfg.eval_split, step=0, greedy=before)
    start = time.monotonic()
    after, step = before, 0
    for step in range(1, cfg.steps + 1):
        # Rollout: each prompt repeated group_size times, contiguous (GRPO's group layout).
        problems = [next(train_stream) for _ in range(cfg.prompts_per_step)]
        grouped = [p for p in problems for _ in range(cfg.group_size)]
        model.eval()
        prompt_ids, prompt_mask, response_ids = generate(
            model, tokenizer, [format_prompt(p, template="short") for p in grouped],
            max_new_tokens=cfg.max_new_tokens, do_sample=True, temperature=cfg.temperature)
        response_mask = response_mask_from_eos(response_ids, eos_token_id=tokenizer.eos_token_id)
        reward = torch.tensor(rewards(tokenizer, response_ids, [p.answer for p in grouped]))
        advantages = grpo_advantages(reward, group_size=cfg.group_size)
        token_advantages = advantages.unsqueeze(-1).expand_as(response_ids)
        log_probs_of_batch = functools.partial(
            response_log_probs, model, prompt_ids=prompt_ids, prompt_mask=prompt_mask,
            response_ids=response_ids, response_mask=response_mask, temperature=cfg.temperature)
        with torch.no_grad():
            old_log_probs = log_probs_of_batch()

        # Train: PPO-clipped policy gradient on the GRPO advantages, no KL, no critic.
        model.train()
        for _ in range(cfg.ppo_epochs):
            log_probs = log_probs_of_batch()
            result = ppo_policy_loss(log_probs, old_log_probs, token_advantages, response_mask,
                                     clip_ratio=cfg.clip_ratio, aggregation="token-mean")
            optimizer.zero_grad(set_to_none=True)
            result.loss.backward()
            torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
            optimizer.step()

        elapsed = time.monotonic() - start
        out_of_time = elapsed > cfg.max_seconds
        if step % cfg.eval_every == 0 or step == cfg.steps or out_of_time:
            model.eval()
            after = accuracy(model, tokenizer, evaluated)
            log.info(cfg.eval_split, step=step, greedy=after, train_reward=reward.mean().item(),
                     elapsed_s=round(time.monotonic() - start, 1))
        if out_of_time:
            break
    seconds = time.monotonic() - start
    summary = {"before": before, "after": after, "gain_points": 100 * (after - before),
               "steps": step, "seconds": round(seconds, 1)}
    name = "held-out" if cfg.eval_split == "heldout" else "validation"
    print(f"{name} greedy accuracy {before:.3f} -> {after:.3f} "
          f"({summary['gain_points']:+.1f} points) in {step} GRPO steps, {seconds:.0f} s "
          f"(seed {cfg.seed}, {cfg.eval_problems} problems)")
    return summary


if __name__ == "__main__":
    main(parse_args())
