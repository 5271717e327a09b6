"""Benchmarks → a common `Task` record; seeded splits; the contamination guard."""
from trinity.data.loaders import (
    BENCHMARKS,
    DataError,
    default_root,
    format_choice_prompt,
    gpqa_permutation,
    load_aime,
    load_benchmark,
    load_bigcodebench,
    load_bigcodebench_hard,
    load_gpqa,
    load_gsm8k,
    load_humaneval,
    load_livecodebench,
    load_math500,
    load_mbpp,
    load_mmlu,
    load_mt_bench,
)
from trinity.data.splits import (
    HELDOUT_SOURCES,
    ContaminationError,
    Splits,
    assert_no_contamination,
    build_all_splits,
    build_splits,
    load_tasks,
    sample_tasks,
    save_tasks,
)

__all__ = [
    "BENCHMARKS", "DataError", "default_root", "format_choice_prompt", "gpqa_permutation", "load_aime",
    "load_benchmark", "load_bigcodebench", "load_bigcodebench_hard", "load_gpqa", "load_gsm8k", "load_humaneval",
    "load_livecodebench", "load_math500", "load_mbpp", "load_mmlu", "load_mt_bench", "HELDOUT_SOURCES",
    "ContaminationError", "Splits", "assert_no_contamination", "build_all_splits", "build_splits", "load_tasks", "sample_tasks", "save_tasks",
]
