"""Open-ended benchmark: MT-Bench (grader "judge")."""
from __future__ import annotations

from trinity.data.loaders.reading import DataError, PathLike, check_unique, field, iter_jsonl, require_file
from trinity.records import Task

MT_BENCH_REFERENCE_CATEGORIES = ("math", "reasoning", "coding")  # FastChat's NEED_REF_CATS


def load_mt_bench(root: PathLike) -> list[Task]:
    """MT-Bench: 80 two-turn questions. metadata["reference"] = GPT-4 reference turns (FastChat's
    reference_answer/gpt-4.jsonl; required for math, reasoning and coding), metadata["question_reference"]
    = the short reference some questions carry inline."""
    qpath = require_file(root, "mt_bench", "lm-sys_FastChat", "question.jsonl")
    rpath = require_file(root, "mt_bench", "lm-sys_FastChat", "reference_answer", "gpt-4.jsonl")
    refs: dict[int, list[str]] = {}
    for n, rec in iter_jsonl(rpath):
        where = f"{rpath}: line {n}"
        qid = field(rec, "question_id", int, where)
        choices = field(rec, "choices", list, where)
        turns = choices[0].get("turns") if choices and isinstance(choices[0], dict) else None
        if not (isinstance(turns, list) and all(isinstance(t, str) for t in turns)):
            raise DataError(f"{where} (question {qid}): choices[0].turns should be a list of strings")
        refs[qid] = turns
    tasks = []
    for n, rec in iter_jsonl(qpath):
        where = f"{qpath}: line {n}"
        qid = field(rec, "question_id", int, where)
        where = f"{where} (question {qid})"
        category = field(rec, "category", str, where)
        turns = field(rec, "turns", list, where)
        if len(turns) != 2 or not all(isinstance(t, str) and t.strip() for t in turns):
            raise DataError(f"{where}: 'turns' should be two non-empty strings")
        if category in MT_BENCH_REFERENCE_CATEGORIES and qid not in refs:
            raise DataError(f"{rpath}: no GPT-4 reference answer for question {qid} ({category})")
        tasks.append(
            Task(
                id=f"mt_bench/{qid}",
                source="mt_bench",
                prompt=tuple(turns),
                grader="judge",
                metadata={
                    "question_id": qid,
                    "category": category,
                    "reference": refs.get(qid),
                    "needs_reference": category in MT_BENCH_REFERENCE_CATEGORIES,
                    "question_reference": rec.get("reference"),
                },
            )
        )
    return check_unique(tasks, qpath)
