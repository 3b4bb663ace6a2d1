"""bench_reasoning's flags: every setting a user can change, and bad ones refused with the
flag named (exit 2) before anything starts."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench_reasoning import FULL, parse_args
from reasoning_trl import TrlSetup


def test_the_default_is_the_full_setting_with_both_trl_setups() -> None:
    args, settings = parse_args(["--trl", "1x2,2x1"])
    assert settings.model == FULL.model and settings.rounds == 3
    assert (settings.prompts, settings.group_size, settings.max_new_tokens) == (64, 8, 64)
    assert settings.micro_batch_size == 64
    assert args.setups == [TrlSetup(1, 2, "sdpa"), TrlSetup(2, 1, "sdpa")]
    # the vLLM contender takes pi_old from its training forward unless asked to recompute
    assert not settings.vllm_recompute
    assert parse_args(["--vllm-recompute"])[1].vllm_recompute
    # the vLLM contender runs collocated unless a mode (or the best HF mode) is asked for
    assert args.vllm_mode == "collocated"
    assert parse_args(["--vllm-mode", "best"])[0].vllm_mode == "best"
    # each contender starts once the previous one's processes are gone, 30 s at most
    assert args.settle == 30.0
    # every contender, TRL too, allocates with rlinf's default host malloc unless asked
    assert settings.allocator == "jemalloc" and settings.describe()["allocator"] == "jemalloc"
    assert parse_args(["--allocator", "system"])[1].allocator == "system"
    # rlinf's ranks are local processes of each run, as a user's run starts them, unless
    # the benchmark is asked to keep one Ray instance for all of them
    assert not settings.ray and settings.describe()["ray"] is False
    assert parse_args(["--ray"])[1].ray


@pytest.mark.parametrize(("flags", "kernels"), [
    (["--precision", "bf16"], ["sdpa", "sdpa", "eager", "eager"]),
    # rlinf's actor trains bf16 on CPU with eager attention at any width (one kernel for
    # every pass of the policy), so TRL runs with it too, long responses included
    (["--precision", "bf16", "--new-tokens", "300"], ["sdpa", "sdpa", "eager", "eager"]),
    (["--precision", "fp32"], ["sdpa", "sdpa"]),
])
def test_trl_also_runs_with_the_kernel_rlinfs_actor_trains_with(
        flags: list[str], kernels: list[str], monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr("os.cpu_count", lambda: 2)
    args, _ = parse_args(flags)
    assert [((c.processes, c.threads), c.attention) for c in args.setups] == list(zip(
        [(1, 2), (2, 1)] * 2, kernels, strict=False))
    chosen, _ = parse_args(["--trl", "2x1:eager,1x2"])
    assert chosen.setups == [TrlSetup(2, 1, "eager"), TrlSetup(1, 2, "sdpa")]


def test_flags_set_the_model_and_the_workload() -> None:
    _, settings = parse_args(["--layers", "2", "--hidden", "256", "--prompts", "32",
                              "--group-size", "4", "--new-tokens", "32", "--rounds", "4",
                              "--trl", "1x2,2x1"])
    model = settings.model
    assert (model.num_layers, model.hidden_size, model.num_heads, model.num_kv_heads,
            model.intermediate_size) == (2, 256, 4, 2, 768)
    assert (settings.prompts, settings.group_size, settings.max_new_tokens,
            settings.rounds) == (32, 4, 32, 4)
    # 128 rows, 64 per TRL process: micro-batches of 64
    assert settings.micro_batch_size == 64
    _, odd = parse_args(["--prompts", "6", "--group-size", "4", "--trl", "1x2,2x1"])
    assert odd.micro_batch_size == 12  # the largest divisor of 12 rows per process up to 64


@pytest.mark.parametrize(("flags", "message"), [
    (["--hidden", "100"], "multiple of 64"),
    (["--prompts", "0"], "--prompts must be >= 1"),
    (["--group-size", "1"], "--group-size must be >= 2"),
    (["--prompts", "3", "--group-size", "3", "--trl", "2x1"], "do not split over 2"),
    (["--micro-batch", "5"], "must divide"),
    (["--trl", "two"], "PROCESSESxTHREADS"),
    (["--trl", "2x1:flash"], "sdpa or eager"),
    (["--settle", "-1"], "--settle must be >= 0"),
    (["--allocator", "tcmalloc"], "--allocator: invalid choice"),
])
def test_bad_flags_exit_2_naming_the_flag(flags: list[str], message: str,
                                          capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exited:
        parse_args(flags)
    assert exited.value.code == 2
    assert message in capsys.readouterr().err
