"""Math reasoning tasks: problems, datasets, a procedural generator, extraction, rewards."""

from rlinf.envs.math.choices import split_label
from rlinf.envs.math.datasets import (
    VERL_KEYS,
    DataKeys,
    dataset_splits,
    load_problems,
    problem_from_record,
    save_jsonl,
)
from rlinf.envs.math.extract import (
    extract_answer,
    extract_boxed,
    extract_hash_answer,
    extract_last_number,
    extract_phrase_answer,
)
from rlinf.envs.math.generator import GeneratorConfig, ProblemGenerator, split_of
from rlinf.envs.math.problem import MathProblem
from rlinf.envs.math.reward import Grade, grade, score, score_batch
from rlinf.envs.math.templates import compact_form, format_chat, format_prompt
from rlinf.envs.math.verify import (
    DEFAULT_TIMEOUT,
    Verdict,
    check_answer,
    is_equivalent,
    normalize_answer,
    parse_number,
    warm_up_verifier,
)

__all__ = [
    "DEFAULT_TIMEOUT",
    "VERL_KEYS",
    "DataKeys",
    "GeneratorConfig",
    "Grade",
    "MathProblem",
    "ProblemGenerator",
    "Verdict",
    "check_answer",
    "compact_form",
    "dataset_splits",
    "extract_answer",
    "extract_boxed",
    "extract_hash_answer",
    "extract_last_number",
    "extract_phrase_answer",
    "format_chat",
    "format_prompt",
    "grade",
    "is_equivalent",
    "load_problems",
    "normalize_answer",
    "parse_number",
    "problem_from_record",
    "save_jsonl",
    "score",
    "score_batch",
    "split_label",
    "split_of",
    "warm_up_verifier",
]
