"""Your own benchmark: a JSONL file of items declared in params.yaml (`data.user_benchmarks: {name: path}`), then named
like any staged benchmark under `data.train`, `data.in_distribution` or `data.heldout` (docs/user_benchmarks.md).

One JSON object per line. Every item has a unique `id` (a string) and a `type`, which picks the grader:

* "math"   — `question`, `answer` (the reference final answer: a number, or LaTeX such as "\\frac{1}{2}"). The
             model is asked to put its final answer in \\boxed{}; compared as MATH-500 answers are (numbers
             numerically, LaTeX symbolically). Optional `answer_type`: "latex" (default), "number" or "integer".
* "choice" — `question`, `choices` (2-4 option texts, in order), `answer` (the correct option's letter, "A"-"D").
             Asked in MMLU's multiple-choice format; graded on the reply's last `Answer: X` line.
* "code"   — `question` (what to write, naming the function), `tests`, `entry_point` (the function's name).
             `test_format`: "assert" (default; `tests` are assert lines run after the model's code, as MBPP's) or
             "humaneval" (`tests` define `check(candidate)`, called with the entry point, as HumanEval's). Run in
             the project's sandbox (no network) like every benchmark's code.
* "open"   — an open question for the MT-Bench judge: `question` (one turn) or `turns` (two user turns, asked as
             a conversation and judged turn by turn, as MT-Bench's). Optional `category` (MT-Bench's: writing, roleplay, extraction, stem,
             humanities, reasoning, math, coding; default "writing"); "math", "reasoning" and "coding" are judged
             against a `reference` answer (a list with one answer per turn), which they then need.

Any other field is an error (a typo must not silently drop a reference answer), except `metadata` (an object kept
on the task as it is). A benchmark is scored on one scale: open questions (judged 1-10) go in a file of their own,
apart from the right-or-wrong types. Task ids are "<name>/<id>"; the file is read in place, never copied.
"""
from __future__ import annotations

from pathlib import Path
from typing import Any

from trinity.data.loaders.choice import CHOICE_LETTERS, format_choice_prompt
from trinity.data.loaders.judge import MT_BENCH_REFERENCE_CATEGORIES
from trinity.data.loaders.math import MATH_INSTRUCTION
from trinity.data.loaders.reading import DataError, check_unique, field, iter_jsonl, nonempty
from trinity.records import Task

ITEM_TYPES = ("math", "choice", "code", "open")
"""What an item's `type` may be (each picks a grader: math, choice, code, the judge)."""

MT_BENCH_CATEGORIES = ("writing", "roleplay", "extraction", "stem", "humanities", "reasoning", "math", "coding")

_FIELDS = {  # type -> (required fields, optional fields)
    "math": ({"question", "answer"}, {"answer_type"}),
    "choice": ({"question", "choices", "answer"}, set()),
    "code": ({"question", "tests", "entry_point"}, {"test_format"}),
    "open": (set(), {"question", "turns", "category", "reference"}),
}
_COMMON = {"id", "type", "metadata"}

def load_user_benchmark(path: str | Path, name: str) -> list[Task]:
    """Every item of the JSONL file at `path` as a Task of source `name`; a bad item raises DataError naming the
    file, the line and the field."""
    path = Path(path)
    if not path.is_file():
        raise DataError(f"{path}: file not found (user benchmark {name!r}, params data.user_benchmarks)")
    tasks = [_task(rec, name, f"{path}: line {n}") for n, rec in iter_jsonl(path)]
    if not tasks:
        raise DataError(f"{path}: no items (user benchmark {name!r})")
    judged = [t.grader == "judge" for t in tasks]
    if any(judged) and not all(judged):
        first = next(t for t, j in zip(tasks, judged) if j != judged[0])
        raise DataError(f"{path}: item {first.id.split('/', 1)[1]!r}: a benchmark is scored on one scale, and open "
                        "questions are judged 1-10 where the others are right or wrong: put the open questions in a "
                        "benchmark (file) of their own")
    return check_unique(tasks, path)


def _task(rec: dict[str, Any], name: str, where: str) -> Task:
    raw_id = field(rec, "id", (str, int), where)
    item_id = nonempty(str(raw_id), "id", where)
    where = f"{where} (id {item_id!r})"
    kind = field(rec, "type", str, where)
    if kind not in ITEM_TYPES:
        raise DataError(f"{where}: field 'type' is {kind!r}; it must be one of {', '.join(ITEM_TYPES)}")
    required, optional = _FIELDS[kind]
    unknown = sorted(set(rec) - required - optional - _COMMON)
    if unknown:
        raise DataError(f"{where}: unknown field {unknown[0]!r} for a {kind!r} item (allowed: "
                        f"{', '.join(sorted(required | optional | _COMMON))})")
    metadata = dict(field(rec, "metadata", dict, where)) if "metadata" in rec else {}
    tid = f"{name}/{item_id}"
    if kind == "math":
        question = nonempty(field(rec, "question", str, where), "question", where)
        answer = nonempty(str(field(rec, "answer", (str, int, float), where)), "answer", where)
        answer_type = field(rec, "answer_type", str, where) if "answer_type" in rec else "latex"
        if answer_type not in ("latex", "number", "integer"):
            raise DataError(f"{where}: field 'answer_type' is {answer_type!r}; use latex, number or integer")
        return Task(id=tid, source=name, prompt=(f"{question.strip()}\n{MATH_INSTRUCTION}",), grader="math",
                    answer=answer, metadata={**metadata, "answer_type": answer_type, "problem": question})
    if kind == "choice":
        question = nonempty(field(rec, "question", str, where), "question", where)
        choices = field(rec, "choices", list, where)
        if not 2 <= len(choices) <= len(CHOICE_LETTERS):
            raise DataError(f"{where}: field 'choices' has {len(choices)} options; give 2 to {len(CHOICE_LETTERS)}")
        for i, c in enumerate(choices):
            if not isinstance(c, str) or not c.strip():
                raise DataError(f"{where}: field 'choices' item {i} should be a non-empty string, got {c!r}")
        letters = CHOICE_LETTERS[: len(choices)]
        answer = field(rec, "answer", str, where).strip()
        if answer not in letters:
            raise DataError(f"{where}: field 'answer' is {answer!r}; it must be one of {', '.join(letters)} "
                            f"(the letter of the correct option)")
        return Task(id=tid, source=name, prompt=(format_choice_prompt(question, choices),), grader="choice",
                    answer=answer, metadata={**metadata, "choices": list(choices), "problem": question})
    if kind == "code":
        question = nonempty(field(rec, "question", str, where), "question", where)
        tests = nonempty(field(rec, "tests", str, where), "tests", where)
        entry = nonempty(field(rec, "entry_point", str, where), "entry_point", where).strip()
        if not entry.isidentifier():
            raise DataError(f"{where}: field 'entry_point' {entry!r} is not a Python function name")
        fmt = field(rec, "test_format", str, where) if "test_format" in rec else "assert"
        if fmt not in ("assert", "humaneval"):
            raise DataError(f"{where}: field 'test_format' is {fmt!r}; use assert or humaneval")
        if fmt == "humaneval" and "def check(" not in tests:
            raise DataError(f"{where}: field 'tests' defines no check(candidate) (test_format humaneval)")
        prompt = (f"{question.strip()}\n\nWrite the Python function `{entry}`. Reply with the full implementation "
                  "(including any imports) in one ```python code block.")
        return Task(id=tid, source=name, prompt=(prompt,), grader="code", tests=tests,
                    metadata={**metadata, "test_format": fmt, "entry_point": entry, "problem": question})
    # open: a question (or a conversation) for the judge
    if ("question" in rec) == ("turns" in rec):
        raise DataError(f"{where}: an 'open' item needs exactly one of 'question' (one turn) or 'turns' (a list)")
    if "question" in rec:
        turns = [nonempty(field(rec, "question", str, where), "question", where)]
    else:
        turns = field(rec, "turns", list, where)
        if not 1 <= len(turns) <= 2 or not all(isinstance(t, str) and t.strip() for t in turns):
            raise DataError(f"{where}: field 'turns' should be a list of one or two non-empty strings (the judge's "
                            "prompts cover one- and two-turn conversations)")
    category = field(rec, "category", str, where) if "category" in rec else "writing"
    if category not in MT_BENCH_CATEGORIES:
        raise DataError(f"{where}: field 'category' is {category!r}; use one of {', '.join(MT_BENCH_CATEGORIES)}")
    reference = None
    if "reference" in rec:
        reference = field(rec, "reference", list, where)
        if len(reference) != len(turns) or not all(isinstance(r, str) and r.strip() for r in reference):
            raise DataError(f"{where}: field 'reference' should hold one non-empty answer per turn "
                            f"({len(turns)}), got {len(reference)}")
    elif category in MT_BENCH_REFERENCE_CATEGORIES:
        raise DataError(f"{where}: category {category!r} is judged against a reference answer: add 'reference' "
                        f"(a list with one answer per turn) or use another category")
    return Task(id=tid, source=name, prompt=tuple(turns), grader="judge",
                metadata={**metadata, "category": category, "reference": reference,
                          "needs_reference": category in MT_BENCH_REFERENCE_CATEGORIES, "question_reference": None})
