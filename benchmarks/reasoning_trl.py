"""TRL's `GRPOTrainer` on the benchmark's workload, timed per optimizer step.

Set up the way a user who picks TRL on a CPU would get the most out of it, checked against
TRL 1.16's source (`trl/trainer/grpo_trainer.py`):

- ``beta=0``: no reference model is created and no reference log-probs are computed;
- ``num_iterations=1`` with ``gradient_accumulation_steps`` equal to ``steps_per_generation``
  (TRL's default): generation happens once per optimizer step, on the whole generation batch
  (prompts × group in one ``generate`` call), and ``old_per_token_logps`` is *not* computed
  (TRL uses the detached current log-probs instead) — no extra forward pass;
- no vLLM (TRL with vLLM on CPU fails at its first weight sync here), no gradient
  checkpointing, the benchmark's precision (``bf16=True``: accelerate's bf16 autocast over
  fp32 weights, as rlinf's bf16), no logging of completions, constant learning rate, no
  shuffling (the prompts of step ``i`` are exactly the ones rlinf trains on at step ``i``).

One optimizer step = one iteration: generation of prompts × group responses, reward, one
AdamW step over micro-batches of `micro_batch_size` rows. Its wall time is taken between
consecutive ``on_step_end`` callbacks; response tokens come from TRL's own
``completions/mean_length`` metric.
"""

from __future__ import annotations

import tempfile
import time
from collections.abc import Sequence
from typing import Any

from reasoning_summary import RunResult

from rlinf.envs.math import MathProblem, format_prompt, score
from rlinf.workers.models import TinyLMConfig, build_char_tokenizer, build_tiny_causal_lm

__all__ = ["run_trl"]


def run_trl(
    batches: Sequence[Sequence[MathProblem]], *, model_config: TinyLMConfig, model_seed: int,
    group_size: int, max_new_tokens: int, temperature: float, lr: float,
    micro_batch_size: int, max_grad_norm: float, clip_ratio: float, seed: int,
    warmup: int, template: str = "short", threads: int | None = None, bf16: bool = False,
) -> RunResult:
    """Train ``len(batches)`` GRPO steps with TRL; the first `warmup` are not timed.

    `threads` sets torch's intra-op threads for the run (None: torch's default, one per
    core); the previous setting is restored afterwards. `bf16` trains with TRL's ``bf16=True``
    (accelerate's bf16 autocast, generation included).
    """
    import torch

    previous = torch.get_num_threads()
    if threads is not None:
        torch.set_num_threads(threads)
    try:
        return _run(batches, model_config=model_config, model_seed=model_seed,
                    group_size=group_size, max_new_tokens=max_new_tokens,
                    temperature=temperature, lr=lr, micro_batch_size=micro_batch_size,
                    max_grad_norm=max_grad_norm, clip_ratio=clip_ratio, seed=seed,
                    warmup=warmup, template=template, bf16=bf16)
    finally:
        torch.set_num_threads(previous)


def _run(
    batches: Sequence[Sequence[MathProblem]], *, model_config: TinyLMConfig, model_seed: int,
    group_size: int, max_new_tokens: int, temperature: float, lr: float,
    micro_batch_size: int, max_grad_norm: float, clip_ratio: float, seed: int,
    warmup: int, template: str, bf16: bool,
) -> RunResult:
    import torch
    from datasets import Dataset
    from transformers import TrainerCallback
    from trl import GRPOConfig, GRPOTrainer

    tokenizer = build_char_tokenizer()
    model = build_tiny_causal_lm(model_config, seed=model_seed, tokenizer=tokenizer)
    rows = [{"prompt": format_prompt(p, template=template), "answer": p.answer}  # type: ignore[arg-type]
            for batch in batches for p in batch]
    prompts_per_step = len(batches[0])
    if any(len(b) != prompts_per_step for b in batches):
        raise ValueError("every step needs the same number of prompts")
    samples_per_step = prompts_per_step * group_size
    if samples_per_step % micro_batch_size:
        raise ValueError(f"micro_batch_size {micro_batch_size} must divide the "
                         f"{samples_per_step} samples of a step")

    def reward(prompts: list[str], completions: list[str], answer: list[str],
               **_: Any) -> list[float]:
        return [score(c, a, strategies=("last_number",)) for c, a in zip(completions, answer,
                                                                          strict=True)]

    class Timer(TrainerCallback):  # type: ignore[misc]
        def __init__(self) -> None:
            self.ends: list[float] = []
            self.lengths: list[float] = []

        def on_train_begin(self, args: Any, state: Any, control: Any, **kw: Any) -> None:
            self.ends.append(time.perf_counter())

        def on_step_end(self, args: Any, state: Any, control: Any, **kw: Any) -> None:
            self.ends.append(time.perf_counter())

        def on_log(self, args: Any, state: Any, control: Any, logs: Any = None,
                   **kw: Any) -> None:
            if logs and "completions/mean_length" in logs:
                self.lengths.append(float(logs["completions/mean_length"]))

    timer = Timer()
    with tempfile.TemporaryDirectory(prefix="rlinf-bench-trl-") as out:
        config = GRPOConfig(
            output_dir=out, per_device_train_batch_size=micro_batch_size,
            gradient_accumulation_steps=samples_per_step // micro_batch_size,
            num_generations=group_size, max_completion_length=max_new_tokens,
            temperature=temperature, top_p=1.0, top_k=0, learning_rate=lr,
            lr_scheduler_type="constant", warmup_steps=0, weight_decay=0.0,
            max_grad_norm=max_grad_norm, beta=0.0, num_iterations=1, epsilon=clip_ratio,
            loss_type="dapo", scale_rewards="group", max_steps=len(batches),
            logging_steps=1, save_strategy="no", report_to=[], use_cpu=True, bf16=bf16,
            seed=seed, data_seed=seed, shuffle_dataset=False, disable_tqdm=True,
            log_completions=False, dataloader_num_workers=0,
        )
        trainer = GRPOTrainer(model=model, reward_funcs=[reward], args=config,
                              train_dataset=Dataset.from_list(rows),
                              processing_class=tokenizer, callbacks=[timer])
        trainer.train()
    seconds = [b - a for a, b in zip(timer.ends, timer.ends[1:], strict=False)]
    if len(seconds) != len(batches) or len(timer.lengths) != len(batches):
        raise RuntimeError(f"TRL ran {len(seconds)} steps with {len(timer.lengths)} logged "
                           f"lengths; expected {len(batches)}")
    timed = slice(warmup, None)
    return RunResult(
        name=f"trl GRPOTrainer ({torch.get_num_threads()} threads)", system="trl", engine="hf",
        seconds=seconds[timed], samples=[samples_per_step] * len(seconds[timed]),
        tokens=[round(m * samples_per_step) for m in timer.lengths[timed]])
