"""A researcher's own data and rewards through the CLI: veRL's Parquet layout and a
Hugging Face `datasets` folder with mapped keys, trained 2 steps each, with TRL-shaped,
veRL-shaped and per-sample reward functions weighted and logged one by one."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from .test_run import read_jsonl, run_cli

pytestmark = pytest.mark.timeout(900)

REWARDS = '''
def level_bonus(prompts, completions, ground_truth, level, **kwargs):
    """TRL's shape, reading the dataset's `level` column."""
    assert all(isinstance(p, list) for p in prompts), prompts  # veRL's chat messages
    return [float(c[0]["content"].strip() == g) * lv
            for c, g, lv in zip(completions, ground_truth, level)]


def compute_score(data_source, solution_str, ground_truth, extra_info=None):
    """veRL's shape, as its reward modules are written."""
    assert data_source == "openai/gsm8k" and isinstance(extra_info["index"], int)
    return {"score": float(solution_str.strip() == ground_truth), "extra": 0.0}


def mapped_bonus(prompts, completions, ground_truth, lvl):
    """TRL's shape on a mapped column (named `lvl`), no **kwargs."""
    assert all(isinstance(p, str) for p in prompts)
    return [float(lv) for lv in lvl]
'''


def _problems(count: int, seed: int) -> list[tuple[str, str, int]]:
    import random

    rng = random.Random(seed)
    out = []
    for _ in range(count):
        a, b = rng.randint(1, 40), rng.randint(1, 40)
        out.append((f"{a}+{b}=", str(a + b), rng.randint(1, 3)))
    return out


@pytest.fixture
def user_env(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A folder on PYTHONPATH holding the user's reward module."""
    (tmp_path / "my_rewards.py").write_text(REWARDS)
    monkeypatch.setenv("PYTHONPATH", f"{tmp_path}{os.pathsep}{os.environ.get('PYTHONPATH', '')}")
    return tmp_path


def test_a_verl_parquet_trains_with_weighted_rewards_of_every_shape(
        user_env: Path, ray_address: str) -> None:
    import pyarrow as pa
    import pyarrow.parquet as pq

    def rows(problems: list[tuple[str, str, int]]) -> list[dict[str, object]]:
        return [{"data_source": "openai/gsm8k", "ability": "math", "level": level,
                 "prompt": [{"role": "user", "content": question}],
                 "reward_model": {"style": "rule", "ground_truth": answer},
                 "extra_info": {"split": "train", "index": i}}
                for i, (question, answer, level) in enumerate(problems)]

    pq.write_table(pa.Table.from_pylist(rows(_problems(32, 0))), user_env / "train.parquet")
    pq.write_table(pa.Table.from_pylist(rows(_problems(8, 1))), user_env / "test.parquet")
    run = user_env / "run"
    proc = run_cli(run, f"data.path={user_env / 'train.parquet'}",
                   f"data.heldout_path={user_env / 'test.parquet'}",
                   "reward.functions=[math,my_rewards:level_bonus,my_rewards:compute_score]",
                   "reward.weights=[1.0,0.5,0.25]", "run.predict=false",
                   ray_address=ray_address)
    assert "first prompt:" in proc.stdout
    records = [r for r in read_jsonl(run / "metrics.jsonl") if "reward/mean" in r]
    assert [r["step"] for r in records] == [1, 2]
    for record in records:
        parts = (record["reward/fn/math"], record["reward/fn/level_bonus"],
                 record["reward/fn/compute_score"])
        assert record["reward/mean"] == pytest.approx(
            parts[0] + 0.5 * parts[1] + 0.25 * parts[2], abs=1e-5)
        assert record["reward/fn/compute_score"] == pytest.approx(parts[0], abs=1e-6)
    samples = [json.loads(line) for line in (run / "samples.jsonl").read_text().splitlines()]
    assert samples and samples[0]["answer"] in {a for _, a, _ in _problems(8, 1)}


def test_a_datasets_folder_with_mapped_keys_trains(user_env: Path, ray_address: str) -> None:
    datasets = pytest.importorskip("datasets")

    def split(problems: list[tuple[str, str, int]]) -> object:
        return datasets.Dataset.from_list([{"q": q, "gold": {"value": a}, "meta": {"level": lv}}
                                           for q, a, lv in problems])

    folder = user_env / "mine"
    datasets.DatasetDict({"train": split(_problems(32, 2)),
                          "test": split(_problems(8, 3))}).save_to_disk(str(folder))
    run = user_env / "run"
    proc = run_cli(run, f"data.path={folder}", "data.prompt_key=q",
                   "data.answer_key=gold.value", "data.columns=[lvl:meta.level]",
                   "reward.functions=[math,my_rewards:mapped_bonus]", "run.predict=false",
                   ray_address=ray_address)
    assert "held-out 8" in proc.stdout or "8 held-out" in proc.stdout, proc.stdout
    records = [r for r in read_jsonl(run / "metrics.jsonl") if "reward/mean" in r]
    assert [r["step"] for r in records] == [1, 2]
    assert all(1.0 <= r["reward/fn/mapped_bonus"] <= 3.0 for r in records)
