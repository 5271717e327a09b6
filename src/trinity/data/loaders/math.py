"""Math benchmarks: MATH-500, GSM8K, AIME 2024/2025 (grader "math")."""
from __future__ import annotations

import re
from typing import Any

from trinity.data.loaders.reading import DataError, PathLike, check_unique, field, iter_jsonl, nonempty, require_file
from trinity.records import Task

# A final-answer instruction shared by every math source (the Qwen/QwQ evaluation convention).
MATH_INSTRUCTION = "Please reason step by step, and put your final answer within \\boxed{}."


def _math_prompt(problem: str) -> str:
    return f"{problem.strip()}\n{MATH_INSTRUCTION}"


def load_math500(root: PathLike, *, max_level: int | None = None) -> list[Task]:
    """MATH-500 (the PRM800K test split). `max_level` keeps problems of difficulty ≤ that level (1-5)."""
    path = require_file(root, "math500", "hkust-nlp_simpleRL-reason", "test.jsonl")
    tasks = []
    for n, rec in iter_jsonl(path):
        where = f"{path}: line {n}"
        uid = nonempty(field(rec, "unique_id", str, where), "unique_id", where)
        where = f"{where} ({uid})"
        problem = nonempty(field(rec, "problem", str, where), "problem", where)
        answer = nonempty(field(rec, "answer", str, where), "answer", where)
        level = field(rec, "level", int, where)
        if not 1 <= level <= 5:
            raise DataError(f"{where}: level {level} outside 1-5")
        if max_level is not None and level > max_level:
            continue
        tasks.append(
            Task(
                id=f"math500/{uid}",
                source="math500",
                prompt=(_math_prompt(problem),),
                grader="math",
                answer=answer,
                metadata={
                    "answer_type": "latex",
                    "problem": problem,
                    "level": level,
                    "subject": field(rec, "subject", str, where),
                },
            )
        )
    return check_unique(tasks, path)


_GSM8K_SPLITS = ("train", "test", "test_socratic")


def _gsm8k_gold(solution: str, where: str) -> str:
    if solution.count("####") != 1:
        raise DataError(f"{where}: answer should contain exactly one '####' marker")
    gold = solution.split("####")[-1].strip().replace(",", "")
    if not re.fullmatch(r"-?\d+(\.\d+)?", gold):
        raise DataError(f"{where}: final answer {gold!r} after '####' is not a number")
    return gold


def load_gsm8k(root: PathLike, *, split: str = "test") -> list[Task]:
    """GSM8K (train 7473 / test 1319). Answer = the number after '####', commas removed. Native id = split-line."""
    if split not in _GSM8K_SPLITS:
        raise ValueError(f"gsm8k split must be one of {_GSM8K_SPLITS}, got {split!r}")
    path = require_file(root, "gsm8k", "openai_grade-school-math", f"{split}.jsonl")
    tasks = []
    for i, (n, rec) in enumerate(iter_jsonl(path)):
        where = f"{path}: line {n}"
        question = nonempty(field(rec, "question", str, where), "question", where)
        solution = field(rec, "answer", str, where)
        tasks.append(
            Task(
                id=f"gsm8k/{split}-{i}",
                source="gsm8k",
                prompt=(_math_prompt(question),),
                grader="math",
                answer=_gsm8k_gold(solution, where),
                metadata={"answer_type": "number", "problem": question, "split": split, "index": i},
            )
        )
    return check_unique(tasks, path)


_AOPS_URL = re.compile(r"(\d{4})_AIME_(I{1,2})_Problems/Problem_(\d+)$")
_QWQ_SUFFIX = "\n" + MATH_INSTRUCTION


def _aime_answer(v: Any, where: str) -> str:
    """AIME answers are integers 0-999; the sources write them as int or zero-padded strings."""
    if isinstance(v, bool) or not isinstance(v, (int, str)):
        raise DataError(f"{where}: field 'answer' should be an integer, got {type(v).__name__}")
    s = str(v).strip()
    if not re.fullmatch(r"\d{1,3}", s):
        raise DataError(f"{where}: AIME answer {v!r} is not an integer 0-999")
    return str(int(s))


def load_aime(root: PathLike, *, years: tuple[int, ...] = (2024, 2025)) -> list[Task]:
    """AIME 2024 (Qwen2.5-Math copy, contest/problem numbers from its AoPS urls) and AIME 2025 (QwQ copy,
    rows in order I-1..I-15, II-1..II-15 — checked against MathArena in SOURCES.md). Native id
    "<year>-<I|II>-<n>"; answer = integer string without leading zeros."""
    tasks: list[Task] = []
    for year in years:
        if year == 2024:
            path = require_file(root, "aime", "qwen25math_aime24", "test.jsonl")
            for n, rec in iter_jsonl(path):
                where = f"{path}: line {n}"
                url = field(rec, "url", str, where)
                m = _AOPS_URL.search(url)
                if not m or int(m.group(1)) != 2024:
                    raise DataError(f"{where}: url {url!r} does not name a 2024 AIME problem")
                contest, number = m.group(2), int(m.group(3))
                problem = nonempty(field(rec, "problem", str, where), "problem", where)
                tasks.append(_aime_task(2024, contest, number, problem, _aime_answer(field(rec, "answer", (int, str), where), where),
                                        {"url": url, "source_file": "qwen25math_aime24/test.jsonl"}))
        elif year == 2025:
            path = require_file(root, "aime", "qwq_aime24_aime25", "aime25.jsonl")
            rows = list(iter_jsonl(path))
            if len(rows) != 30:
                raise DataError(f"{path}: expected 30 AIME 2025 problems (I and II), found {len(rows)}")
            for i, (n, rec) in enumerate(rows):
                where = f"{path}: line {n}"
                prompt = field(rec, "prompt", str, where)
                problem = prompt[: -len(_QWQ_SUFFIX)] if prompt.endswith(_QWQ_SUFFIX) else prompt
                nonempty(problem, "prompt", where)
                contest, number = ("I", i + 1) if i < 15 else ("II", i - 14)
                tasks.append(_aime_task(2025, contest, number, problem, _aime_answer(field(rec, "answer", (int, str), where), where),
                                        {"source_file": "qwq_aime24_aime25/aime25.jsonl"}))
        else:
            raise ValueError(f"AIME years available here: 2024, 2025 (got {year})")
    return check_unique(sorted(tasks, key=lambda t: (t.metadata["year"], t.metadata["contest"], t.metadata["number"])),
                         "aime")


def _aime_task(year: int, contest: str, number: int, problem: str, answer: str, extra: dict) -> Task:
    return Task(
        id=f"aime/{year}-{contest}-{number}",
        source="aime",
        prompt=(_math_prompt(problem),),
        grader="math",
        answer=answer,
        metadata={"answer_type": "integer", "problem": problem.strip(), "year": year, "contest": contest,
                  "number": number, **extra},
    )
