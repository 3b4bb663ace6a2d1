"""TRL's `GRPOTrainer` on the benchmark's workload, in one or more processes of its own.

Set up the way a user who picks TRL on a CPU would get the most out of it, checked against
TRL 1.16's source (`trl/trainer/grpo_trainer.py`):

- ``beta=0``: no reference model is created and no reference log-probs are computed;
- ``num_iterations=1`` with ``gradient_accumulation_steps`` equal to ``steps_per_generation``
  (TRL's default): generation happens once per optimizer step, on the whole generation batch
  (prompts × group, each process generating its share in one ``generate`` call), and
  ``old_per_token_logps`` is *not* computed (TRL uses the detached current log-probs
  instead) — no extra forward pass;
- no vLLM (TRL with vLLM on CPU fails at its first weight sync here), no gradient
  checkpointing, the benchmark's precision (``bf16=True``: accelerate's bf16 autocast over
  fp32 weights, as rlinf's bf16), no logging of completions, constant learning rate, no
  shuffling (the prompts of step ``i`` are exactly the ones rlinf trains on at step ``i``);
- one process with torch's threads, or several data-parallel processes on the CPU
  (``torchrun``; accelerate's MULTI_CPU mode over gloo), each with its share of the threads:
  `TrlSetup`.

One optimizer step = one iteration: generation of prompts × group responses, reward, one
AdamW step over micro-batches of `micro_batch_size` rows per process. Its wall time is taken
between consecutive ``on_step_end`` callbacks of rank 0; CPU-seconds are every rank's
`time.process_time` over the same steps, summed; response tokens come from TRL's own
``completions/mean_length`` metric.

`run_trl` starts the processes (this file as a script) and reads back one JSON file per rank.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import subprocess
import sys
import tempfile
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

__all__ = ["TrlJob", "TrlSetup", "run_trl"]


@dataclass(frozen=True)
class TrlSetup:
    """How TRL runs: `processes` data-parallel processes of `threads` torch threads each,
    its model built with the `attention` kernel (None: the model config's)."""

    processes: int
    threads: int
    attention: str | None = None

    @property
    def label(self) -> str:
        kernel = "" if self.attention is None else f", {self.attention}"
        return f"{self.processes} proc x {self.threads} thr{kernel}"

    @classmethod
    def parse(cls, text: str, *, default_attention: str | None = None) -> TrlSetup:
        """``"PxT"``: P processes of T threads, or ``"PxT:KERNEL"`` (sdpa or eager) with
        that attention kernel (default `default_attention`)."""
        shape, _, kernel = text.partition(":")
        processes, _, threads = shape.partition("x")
        try:
            setup = cls(int(processes), int(threads), kernel or default_attention)
        except ValueError:
            raise ValueError(f"a TRL setup is PROCESSESxTHREADS such as 2x1, got {text!r}") \
                from None
        if setup.processes < 1 or setup.threads < 1:
            raise ValueError(f"a TRL setup needs >= 1 process and thread, got {text!r}")
        if setup.attention not in (None, "sdpa", "eager"):
            raise ValueError(f"a TRL setup's attention is sdpa or eager, got {text!r}")
        return setup


@dataclass(frozen=True)
class TrlJob:
    """Everything a TRL run needs, as plain data (it crosses into the processes as JSON)."""

    problems: list[list[tuple[str, str]]]
    """(question, answer) of every prompt, step by step (warm-up steps first)."""
    model_config: dict[str, Any]
    """`TinyLMConfig` fields."""
    model_seed: int
    group_size: int
    max_new_tokens: int
    temperature: float
    lr: float
    micro_batch_size: int
    max_grad_norm: float
    clip_ratio: float
    seed: int
    bf16: bool
    template: str = "short"


@dataclass(frozen=True)
class TrlTimes:
    """Per optimizer step (every step, warm-up included): wall seconds, CPU-seconds of all
    ranks, and mean response length."""

    seconds: list[float]
    cpu_seconds: list[float]
    lengths: list[float]


def run_trl(job: TrlJob, setup: TrlSetup, *, timeout: float = 3600.0,
            env: Mapping[str, str] | None = None) -> TrlTimes:
    """Train every step of `job` with TRL in `setup`'s processes (with `env` added to their
    environment); the times of each step."""
    steps = len(job.problems)
    samples = len(job.problems[0]) * job.group_size
    if samples % (setup.processes * job.micro_batch_size):
        raise ValueError(f"{setup.processes} processes x micro-batches of "
                         f"{job.micro_batch_size} must divide the {samples} samples of a step")
    script = str(Path(__file__).resolve())
    with tempfile.TemporaryDirectory(prefix="rlinf-bench-trl-") as out:
        job_file = Path(out) / "job.json"
        job_file.write_text(json.dumps(dataclasses.asdict(job)))
        args = ["--job", str(job_file), "--out", out, "--threads", str(setup.threads)]
        if setup.processes == 1:
            command = [sys.executable, script, *args]
        else:
            command = [sys.executable, "-m", "torch.distributed.run", "--standalone",
                       "--nnodes", "1", "--nproc-per-node", str(setup.processes), script, *args]
        environment = {**os.environ, **(env or {}), "OMP_NUM_THREADS": str(setup.threads),
                       "TOKENIZERS_PARALLELISM": "false", "ACCELERATE_USE_CPU": "true"}
        done = subprocess.run(command, env=environment, capture_output=True, text=True,
                              timeout=timeout, check=False)
        if done.returncode != 0:
            raise RuntimeError(f"TRL ({setup.label}) exited {done.returncode}:\n"
                               f"{(done.stdout + done.stderr)[-3000:]}")
        ranks = [json.loads((Path(out) / f"rank{r}.json").read_text())
                 for r in range(setup.processes)]
    cpu = [sum(r["cpu"][i] for r in ranks) for i in range(steps)]
    lead = ranks[0]
    if len(lead["seconds"]) != steps or len(lead["lengths"]) != steps:
        raise RuntimeError(f"TRL ran {len(lead['seconds'])} steps with {len(lead['lengths'])} "
                           f"logged lengths; expected {steps}")
    return TrlTimes(seconds=lead["seconds"], cpu_seconds=cpu, lengths=lead["lengths"])


def _train(job: TrlJob, out: Path, threads: int) -> None:
    """One TRL process (rank from torchrun's environment, 0 alone): train, write its times."""
    import torch

    torch.set_num_threads(threads)
    from datasets import Dataset
    from transformers import TrainerCallback
    from trl import GRPOConfig, GRPOTrainer

    from rlinf.envs.math import MathProblem, format_prompt, score, warm_up_verifier
    from rlinf.workers.models import TinyLMConfig, build_char_tokenizer, build_tiny_causal_lm

    rank, world = int(os.environ.get("RANK", "0")), int(os.environ.get("WORLD_SIZE", "1"))
    tokenizer = build_char_tokenizer()
    model = build_tiny_causal_lm(TinyLMConfig(**job.model_config), seed=job.model_seed,
                                 tokenizer=tokenizer)
    rows = [{"prompt": format_prompt(MathProblem(q, a), template=job.template),  # type: ignore[arg-type]
             "answer": a} for step in job.problems for q, a in step]
    samples_per_step = len(job.problems[0]) * job.group_size

    # The same verifier start-up rlinf's reward workers pay when they start, paid here
    # before the timed steps too.
    warm_up_verifier()

    def reward(prompts: list[str], completions: list[str], answer: list[str],
               **_: Any) -> list[float]:
        return [score(c, a, strategies=("last_number",)) for c, a in zip(completions, answer,
                                                                          strict=True)]

    class Timer(TrainerCallback):  # type: ignore[misc]
        def __init__(self) -> None:
            self.ends: list[float] = []
            self.cpu: list[float] = []
            self.lengths: list[float] = []

        def _mark(self) -> None:
            self.ends.append(time.perf_counter())
            self.cpu.append(time.process_time())

        def on_train_begin(self, args: Any, state: Any, control: Any, **kw: Any) -> None:
            self._mark()

        def on_step_end(self, args: Any, state: Any, control: Any, **kw: Any) -> None:
            self._mark()

        def on_log(self, args: Any, state: Any, control: Any, logs: Any = None,
                   **kw: Any) -> None:
            if logs and "completions/mean_length" in logs:
                self.lengths.append(float(logs["completions/mean_length"]))

    timer = Timer()
    with tempfile.TemporaryDirectory(prefix="rlinf-bench-trl-out-") as scratch:
        config = GRPOConfig(
            output_dir=scratch, per_device_train_batch_size=job.micro_batch_size,
            gradient_accumulation_steps=samples_per_step // (job.micro_batch_size * world),
            num_generations=job.group_size, max_completion_length=job.max_new_tokens,
            temperature=job.temperature, top_p=1.0, top_k=0, learning_rate=job.lr,
            lr_scheduler_type="constant", warmup_steps=0, weight_decay=0.0,
            max_grad_norm=job.max_grad_norm, beta=0.0, num_iterations=1,
            epsilon=job.clip_ratio, loss_type="dapo", scale_rewards="group",
            max_steps=len(job.problems), logging_steps=1, save_strategy="no", report_to=[],
            use_cpu=True, bf16=job.bf16, seed=job.seed, data_seed=job.seed,
            shuffle_dataset=False, disable_tqdm=True, log_completions=False,
            dataloader_num_workers=0, ddp_backend="gloo" if world > 1 else None,
        )
        trainer = GRPOTrainer(model=model, reward_funcs=[reward], args=config,
                              train_dataset=Dataset.from_list(rows),
                              processing_class=tokenizer, callbacks=[timer])
        trainer.train()
    pairs = list(zip(timer.ends, timer.ends[1:], strict=False))
    cpu_pairs = list(zip(timer.cpu, timer.cpu[1:], strict=False))
    (out / f"rank{rank}.json").write_text(json.dumps({
        "seconds": [b - a for a, b in pairs], "cpu": [b - a for a, b in cpu_pairs],
        "lengths": timer.lengths}))


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="one TRL GRPO process of the benchmark")
    parser.add_argument("--job", required=True, type=Path)
    parser.add_argument("--out", required=True, type=Path)
    parser.add_argument("--threads", required=True, type=int)
    args = parser.parse_args(argv)
    raw = json.loads(args.job.read_text())
    raw["problems"] = [[tuple(p) for p in step] for step in raw["problems"]]
    _train(TrlJob(**raw), args.out, args.threads)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
