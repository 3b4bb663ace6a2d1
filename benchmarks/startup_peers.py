"""The single-process peers of bench-startup, each run as a cold process of its own:

- ``trl``: TRL's `GRPOTrainer` on the reasoning app's default workload (its shipped warm-start
  model, its generated level-2 problems in the short template, the same group size, response
  length, learning rate and micro-batch), set up as in `reasoning_trl` (no reference model,
  one generation per optimizer step, no vLLM), in this one process with torch's threads;
- ``sb3``: Stable-Baselines3 PPO on the embodied app's default (InvertedDoublePendulum-v5,
  the same envs, rollout length, epochs, minibatches and 64x64 MLPs), `sb3_ppo.make_ppo`.

Each prints ``<peer> step <k> <seconds since the process started>`` when its k-th training
step (a GRPO optimizer step; a PPO rollout plus update) has finished, so the caller reads
the time to the first finished step from the line; the caller also times the process.

Launch: ``python benchmarks/startup_peers.py trl --steps 2 --prompts 64 --group-size 8``.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

_STARTED = time.perf_counter()  # as early as this process can tell


def _mark(peer: str, step: int) -> None:
    print(f"{peer} step {step} {time.perf_counter() - _STARTED:.3f}", flush=True)


def run_trl(args: argparse.Namespace) -> None:
    """TRL GRPO on the reasoning app's default workload (module docstring)."""
    import os

    import torch

    torch.set_num_threads(len(os.sched_getaffinity(0)))
    from datasets import Dataset
    from rlinf_reasoning.warmstart import load_warmstart
    from transformers import TrainerCallback
    from trl import GRPOConfig, GRPOTrainer

    from rlinf.envs.math import (
        GeneratorConfig,
        ProblemGenerator,
        format_prompt,
        score,
        warm_up_verifier,
    )

    model, tokenizer = load_warmstart()
    generator = ProblemGenerator(GeneratorConfig.for_level(2, seed=0))  # the app's default
    rows = [{"prompt": format_prompt(p, template="short"), "answer": p.answer}
            for step in range(args.steps) for p in generator.batch(step, args.prompts)]
    warm_up_verifier()  # as rlinf's reward workers do when they start

    def reward(prompts: list[str], completions: list[str], answer: list[str],
               **_: Any) -> list[float]:
        return [score(c, a, strategies=("last_number",))
                for c, a in zip(completions, answer, strict=True)]

    class Marks(TrainerCallback):  # type: ignore[misc]
        def on_step_end(self, _args: Any, state: Any, control: Any, **_: Any) -> None:
            _mark("trl", int(state.global_step))

    samples = args.prompts * args.group_size
    micro = min(args.micro_batch, samples)
    with tempfile.TemporaryDirectory(prefix="rlinf-bench-startup-trl-") as scratch:
        config = GRPOConfig(
            output_dir=scratch, per_device_train_batch_size=micro,
            gradient_accumulation_steps=samples // micro, num_generations=args.group_size,
            max_completion_length=args.new_tokens, temperature=1.0, top_p=1.0, top_k=0,
            learning_rate=3e-4, lr_scheduler_type="constant", warmup_steps=0,
            weight_decay=0.0, max_grad_norm=1.0, beta=0.0, num_iterations=1, epsilon=0.2,
            loss_type="dapo", scale_rewards="group", max_steps=args.steps, logging_steps=1,
            save_strategy="no", report_to=[], use_cpu=True, seed=0, data_seed=0,
            shuffle_dataset=False, disable_tqdm=True, log_completions=False,
            dataloader_num_workers=0)
        trainer = GRPOTrainer(model=model, reward_funcs=[reward], args=config,
                              train_dataset=Dataset.from_list(rows), processing_class=tokenizer,
                              callbacks=[Marks()])
        trainer.train()


def run_sb3(args: argparse.Namespace) -> None:
    """SB3 PPO on the embodied app's default (module docstring)."""
    import os

    sys.path.insert(0, str(Path(__file__).resolve().parent))
    from sb3_ppo import Sb3Setting, make_ppo

    setting = Sb3Setting(env="InvertedDoublePendulum-v5", num_envs=args.num_envs,
                         rollout_steps=args.rollout_steps, epochs=10, minibatches=32, width=64)
    model = make_ppo(setting, "dummy", threads=len(os.sched_getaffinity(0)))
    train, done = model.train, [0]

    def marked_train() -> None:
        train()
        done[0] += 1
        _mark("sb3", done[0])

    model.train = marked_train
    try:
        model.learn(total_timesteps=args.num_envs * args.rollout_steps * args.steps)
    finally:
        model.env.close()


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="a single-process peer of bench-startup")
    parser.add_argument("peer", choices=("trl", "sb3"))
    parser.add_argument("--steps", type=int, default=2)
    parser.add_argument("--prompts", type=int, default=64)
    parser.add_argument("--group-size", type=int, default=8)
    parser.add_argument("--new-tokens", type=int, default=6)
    parser.add_argument("--micro-batch", type=int, default=64)
    parser.add_argument("--num-envs", type=int, default=16)
    parser.add_argument("--rollout-steps", type=int, default=128)
    args = parser.parse_args(argv)
    (run_trl if args.peer == "trl" else run_sb3)(args)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
