"""One loader per benchmark: staged files under a root directory → `list[Task]`.

Every loader takes the benchmark root (the directory that holds `math500/`, `mmlu/`, … as laid out in
its SOURCES.md; `default_root()` resolves `TRINITY_DATA_DIR` or params `data.root`) and reads the files
in place — nothing is copied into the repository. A missing or malformed file raises `DataError`
naming the file and the record (line number, row number or native id), so a bad download fails at
load time instead of as a silent zero reward.

Task ids are "<source>/<native id>". Graders and what they expect:

* "math"   — `answer` is the reference; `metadata["answer_type"]` is "latex" (MATH-500), "number"
             (GSM8K) or "integer" (AIME) and picks the comparison in `trinity.grading.math`.
* "choice" — `answer` is the letter; `metadata["choices"]` holds the option texts in prompt order.
* "code"   — `tests` holds the test code, `metadata["test_format"]` says how to run it:
    - "humaneval": program = solution + "\\n" + tests + f"\\ncheck({entry_point})"
    - "assert":    program = solution + "\\n" + tests  (MBPP: setup code, then assert lines)
    - "unittest":  program = solution + "\\n" + tests, then run the `TestCases` unittest class
                   (BigCodeBench; needs the libraries in bigcodebench_repo/requirements-eval.txt)
    - "io":        tests is a JSON list of {"input", "output", "testtype"} (LiveCodeBench public tests);
                   testtype "stdin" feeds input on stdin and compares stdout, "functional" calls
                   `Solution().<metadata["fn_name"]>` with the newline-separated JSON arguments.
  `metadata["entry_point"]` names the function under test; `metadata["reference_solution"]` is the
  benchmark's own solution, kept so the sandbox can be checked against it (never shown to models).
* "judge"  — MT-Bench: both turns in `prompt`, GPT-4 reference answers in `metadata["reference"]`.

One module per family: `math` (MATH-500, GSM8K, AIME), `choice` (MMLU, GPQA), `judge` (MT-Bench), `code`
(HumanEval, MBPP, LiveCodeBench), `bigcodebench` (BigCodeBench and its data fixes); `reading` holds the
shared file and field readers. `BENCHMARKS` and `load_benchmark` below dispatch by name.
"""
from __future__ import annotations

from pathlib import Path
from typing import Any, Callable

from trinity.data.loaders.bigcodebench import BIGCODEBENCH_VERSIONS, load_bigcodebench, load_bigcodebench_hard
from trinity.data.loaders.choice import CHOICE_LETTERS, GPQA_PASSWORD, format_choice_prompt, gpqa_permutation, load_gpqa, load_mmlu
from trinity.data.loaders.code import MBPP_SPLITS, load_humaneval, load_livecodebench, load_mbpp
from trinity.data.loaders.judge import MT_BENCH_REFERENCE_CATEGORIES, load_mt_bench
from trinity.data.loaders.math import MATH_INSTRUCTION, load_aime, load_gsm8k, load_math500
from trinity.data.loaders.reading import DataError, PathLike, default_root
from trinity.records import Task

BENCHMARKS: dict[str, Callable[..., list[Task]]] = {
    "math500": load_math500,
    "mmlu": load_mmlu,
    "gsm8k": load_gsm8k,
    "aime": load_aime,
    "gpqa": load_gpqa,
    "mt_bench": load_mt_bench,
    "humaneval": load_humaneval,
    "mbpp": load_mbpp,
    "livecodebench": load_livecodebench,
    "bigcodebench": load_bigcodebench,
    "bigcodebench_hard": load_bigcodebench_hard,
}


def load_benchmark(name: str, root: PathLike | None = None, **kw: Any) -> list[Task]:
    """Load benchmark `name` (a key of BENCHMARKS) from `root` (default: `default_root()`)."""
    try:
        loader = BENCHMARKS[name]
    except KeyError:
        raise ValueError(f"unknown benchmark {name!r}; known: {sorted(BENCHMARKS)}") from None
    return loader(Path(root) if root is not None else default_root(), **kw)


__all__ = [
    "BENCHMARKS", "BIGCODEBENCH_VERSIONS", "CHOICE_LETTERS", "DataError", "GPQA_PASSWORD", "MATH_INSTRUCTION",
    "MBPP_SPLITS", "MT_BENCH_REFERENCE_CATEGORIES", "PathLike", "default_root", "format_choice_prompt",
    "gpqa_permutation", "load_aime", "load_benchmark", "load_bigcodebench", "load_bigcodebench_hard", "load_gpqa",
    "load_gsm8k", "load_humaneval", "load_livecodebench", "load_math500", "load_mbpp", "load_mmlu", "load_mt_bench",
]
