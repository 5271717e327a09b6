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
"""
from __future__ import annotations

import ast
import csv
import gzip
import hashlib
import io
import json
import os
import re
import warnings
import zipfile
from pathlib import Path
from typing import Any, Callable, Iterator

import numpy as np

from trinity.records import Task


class DataError(ValueError):
    """A benchmark file is missing or malformed; the message names the file and the record."""


PathLike = str | os.PathLike

# A final-answer instruction shared by every math source (the Qwen/QwQ evaluation convention).
MATH_INSTRUCTION = "Please reason step by step, and put your final answer within \\boxed{}."
CHOICE_LETTERS = "ABCD"


def default_root() -> Path:
    """The benchmark directory: env TRINITY_DATA_DIR, else params `data.root` (default ../shared/benchmarks)."""
    from trinity.config import DataSettings

    return DataSettings().resolved_root()


# ---------------------------------------------------------------------------------------------------
# Reading helpers: every failure becomes a DataError that names the file and the record.


def _path(root: PathLike, *parts: str) -> Path:
    p = Path(root).joinpath(*parts)
    if not p.is_file():
        raise DataError(f"{p}: file not found (benchmark root {Path(root)!s})")
    return p


def _iter_jsonl(path: Path, *, gz: bool = False) -> Iterator[tuple[int, dict[str, Any]]]:
    """(line number, object) for every non-blank line; a bad line raises DataError with its number."""
    try:
        f = gzip.open(path, "rt", encoding="utf-8") if gz else open(path, encoding="utf-8")
        with f:
            for n, line in enumerate(f, start=1):
                if not line.strip():
                    continue
                try:
                    obj = json.loads(line)
                except json.JSONDecodeError as e:
                    raise DataError(f"{path}: line {n}: not valid JSON ({e.msg})") from None
                if not isinstance(obj, dict):
                    raise DataError(f"{path}: line {n}: expected a JSON object, got {type(obj).__name__}")
                yield n, obj
    except (OSError, EOFError, UnicodeDecodeError) as e:  # gzip.BadGzipFile is an OSError
        raise DataError(f"{path}: cannot read ({e})") from None


def _read_json(path: Path) -> Any:
    try:
        with open(path, encoding="utf-8") as f:
            return json.load(f)
    except json.JSONDecodeError as e:
        raise DataError(f"{path}: not valid JSON (line {e.lineno}: {e.msg})") from None
    except (OSError, UnicodeDecodeError) as e:
        raise DataError(f"{path}: cannot read ({e})") from None


def _field(rec: dict, key: str, kind: type | tuple[type, ...], where: str) -> Any:
    """rec[key], checked for presence and type; `where` names the file and record for the error."""
    if key not in rec:
        raise DataError(f"{where}: missing field {key!r}")
    v = rec[key]
    kinds = kind if isinstance(kind, tuple) else (kind,)
    if not isinstance(v, kinds) or (isinstance(v, bool) and bool not in kinds):
        names = "/".join(k.__name__ for k in kinds)
        raise DataError(f"{where}: field {key!r} should be {names}, got {type(v).__name__} {str(v)[:60]!r}")
    return v


def _nonempty(v: str, key: str, where: str) -> str:
    if not v.strip():
        raise DataError(f"{where}: field {key!r} is empty")
    return v


def _check_unique(tasks: list[Task], where: Path | str) -> list[Task]:
    seen: set[str] = set()
    for t in tasks:
        if t.id in seen:
            raise DataError(f"{where}: duplicate record id {t.id!r}")
        seen.add(t.id)
    return tasks


def _stable_int(text: str) -> int:
    """A 64-bit integer that depends only on `text` (never on Python's salted hash())."""
    return int.from_bytes(hashlib.sha256(text.encode("utf-8")).digest()[:8], "big")


def _short_hash(text: str) -> str:
    return hashlib.sha256(text.encode("utf-8")).hexdigest()[:12]


def format_choice_prompt(question: str, options: list[str], subject: str | None = None) -> str:
    """The multiple-choice prompt used for MMLU and GPQA (simple-evals style, letters A-D)."""
    letters = CHOICE_LETTERS[: len(options)]
    head = (
        "Answer the following multiple choice question"
        + (f" about {subject}" if subject else "")
        + f". The last line of your response should be of the form 'Answer: X' (without quotes), where X is "
        f"one of {', '.join(letters[:-1])} or {letters[-1]}. Think step by step before answering.\n\n"
    )
    body = question.strip() + "\n\n" + "\n".join(f"{l}) {o}" for l, o in zip(letters, options))
    return head + body


def _math_prompt(problem: str) -> str:
    return f"{problem.strip()}\n{MATH_INSTRUCTION}"


# ---------------------------------------------------------------------------------------------------
# Math


def load_math500(root: PathLike, *, max_level: int | None = None) -> list[Task]:
    """MATH-500 (the PRM800K test split). `max_level` keeps problems of difficulty ≤ that level (1-5)."""
    path = _path(root, "math500", "hkust-nlp_simpleRL-reason", "test.jsonl")
    tasks = []
    for n, rec in _iter_jsonl(path):
        where = f"{path}: line {n}"
        uid = _nonempty(_field(rec, "unique_id", str, where), "unique_id", where)
        where = f"{where} ({uid})"
        problem = _nonempty(_field(rec, "problem", str, where), "problem", where)
        answer = _nonempty(_field(rec, "answer", str, where), "answer", where)
        level = _field(rec, "level", int, where)
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
                    "subject": _field(rec, "subject", str, where),
                },
            )
        )
    return _check_unique(tasks, path)


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
    path = _path(root, "gsm8k", "openai_grade-school-math", f"{split}.jsonl")
    tasks = []
    for i, (n, rec) in enumerate(_iter_jsonl(path)):
        where = f"{path}: line {n}"
        question = _nonempty(_field(rec, "question", str, where), "question", where)
        solution = _field(rec, "answer", str, where)
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
    return _check_unique(tasks, path)


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
            path = _path(root, "aime", "qwen25math_aime24", "test.jsonl")
            for n, rec in _iter_jsonl(path):
                where = f"{path}: line {n}"
                url = _field(rec, "url", str, where)
                m = _AOPS_URL.search(url)
                if not m or int(m.group(1)) != 2024:
                    raise DataError(f"{where}: url {url!r} does not name a 2024 AIME problem")
                contest, number = m.group(2), int(m.group(3))
                problem = _nonempty(_field(rec, "problem", str, where), "problem", where)
                tasks.append(_aime_task(2024, contest, number, problem, _aime_answer(_field(rec, "answer", (int, str), where), where),
                                        {"url": url, "source_file": "qwen25math_aime24/test.jsonl"}))
        elif year == 2025:
            path = _path(root, "aime", "qwq_aime24_aime25", "aime25.jsonl")
            rows = list(_iter_jsonl(path))
            if len(rows) != 30:
                raise DataError(f"{path}: expected 30 AIME 2025 problems (I and II), found {len(rows)}")
            for i, (n, rec) in enumerate(rows):
                where = f"{path}: line {n}"
                prompt = _field(rec, "prompt", str, where)
                problem = prompt[: -len(_QWQ_SUFFIX)] if prompt.endswith(_QWQ_SUFFIX) else prompt
                _nonempty(problem, "prompt", where)
                contest, number = ("I", i + 1) if i < 15 else ("II", i - 14)
                tasks.append(_aime_task(2025, contest, number, problem, _aime_answer(_field(rec, "answer", (int, str), where), where),
                                        {"source_file": "qwq_aime24_aime25/aime25.jsonl"}))
        else:
            raise ValueError(f"AIME years available here: 2024, 2025 (got {year})")
    return _check_unique(sorted(tasks, key=lambda t: (t.metadata["year"], t.metadata["contest"], t.metadata["number"])),
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


# ---------------------------------------------------------------------------------------------------
# Multiple choice

_MMLU_SPLITS = ("dev", "val", "test")


def _mmlu_rows(z: zipfile.ZipFile, zpath: Path, split: str) -> dict[str, list[tuple[int, list[str]]]]:
    """subject → [(row number, [question, A, B, C, D, letter])] for one split of the MMLU zip."""
    out: dict[str, list[tuple[int, list[str]]]] = {}
    suffix = f"_{split}.csv"
    for name in sorted(z.namelist()):
        if not (name.startswith(f"data/{split}/") and name.endswith(suffix)):
            continue
        subject = name[len(f"data/{split}/"): -len(suffix)]
        rows = []
        try:
            with z.open(name) as f:
                for r, row in enumerate(csv.reader(io.TextIOWrapper(f, encoding="utf-8", newline="")), start=1):
                    where = f"{zpath}:{name}: row {r}"
                    if len(row) != 6:
                        raise DataError(f"{where}: expected 6 columns (question, A, B, C, D, answer), got {len(row)}")
                    if row[5].strip() not in CHOICE_LETTERS:
                        raise DataError(f"{where}: answer {row[5]!r} is not one of A-D")
                    if not row[0].strip():
                        raise DataError(f"{where}: empty question")
                    rows.append((r, row))
        except (csv.Error, UnicodeDecodeError, zipfile.BadZipFile, OSError) as e:
            raise DataError(f"{zpath}:{name}: cannot read ({e})") from None
        out[subject] = rows
    if not out:
        raise DataError(f"{zpath}: no data/{split}/*{suffix} files inside")
    return out


def load_mmlu(root: PathLike, *, split: str = "test", n_shot: int = 0, subjects: list[str] | None = None) -> list[Task]:
    """MMLU (57 subjects; test 14042, val 1531, dev 285), read straight from the zip.

    `n_shot` > 0 prepends that many solved dev questions of the same subject (at most 5, the dev set's size).
    Native id "<split>/<subject>/<row>" (row = 1-based CSV row)."""
    if split not in _MMLU_SPLITS:
        raise ValueError(f"mmlu split must be one of {_MMLU_SPLITS}, got {split!r}")
    if not 0 <= n_shot <= 5:
        raise ValueError(f"n_shot must be 0-5 (the dev split has 5 per subject), got {n_shot}")
    zpath = _path(root, "mmlu", "hiyouga_LLaMA-Factory", "mmlu.zip")
    names_path = Path(root) / "mmlu" / "hiyouga_LLaMA-Factory" / "mapping.json"
    mapping = _read_json(names_path) if names_path.is_file() else {}
    try:
        with zipfile.ZipFile(zpath) as z:
            rows = _mmlu_rows(z, zpath, split)
            dev = _mmlu_rows(z, zpath, "dev") if n_shot else {}
    except zipfile.BadZipFile as e:
        raise DataError(f"{zpath}: not a valid zip ({e})") from None
    if subjects is not None:
        unknown = set(subjects) - set(rows)
        if unknown:
            raise ValueError(f"unknown MMLU subjects: {sorted(unknown)}")
    tasks = []
    for subject, items in rows.items():
        if subjects is not None and subject not in subjects:
            continue
        info = mapping.get(subject, {}) if isinstance(mapping, dict) else {}
        name = info.get("name") or subject.replace("_", " ")
        shots = ""
        if n_shot:
            if len(dev.get(subject, [])) < n_shot:
                raise DataError(f"{zpath}: data/dev/{subject}_dev.csv has fewer than {n_shot} rows")
            shots = "".join(
                f"{_mmlu_question_block(row)}\nAnswer: {row[5].strip()}\n\n" for _, row in dev[subject][:n_shot]
            )
        for r, row in items:
            question, options, letter = row[0], [o.strip() for o in row[1:5]], row[5].strip()
            prompt = format_choice_prompt(question, options, subject=name)
            if shots:
                prompt = f"Here are solved examples about {name}:\n\n{shots}Now the question.\n\n{prompt}"
            tasks.append(
                Task(
                    id=f"mmlu/{split}/{subject}/{r}",
                    source="mmlu",
                    prompt=(prompt,),
                    grader="choice",
                    answer=letter,
                    metadata={"subject": subject, "category": info.get("category"), "split": split,
                              "question": question, "choices": options, "n_shot": n_shot},
                )
            )
    return _check_unique(tasks, zpath)


def _mmlu_question_block(row: list[str]) -> str:
    return row[0].strip() + "\n" + "\n".join(f"{l}) {o.strip()}" for l, o in zip(CHOICE_LETTERS, row[1:5]))


GPQA_PASSWORD = b"deserted-untie-orchid"  # published in the GPQA README (README.upstream.md)
_GPQA_SUBSETS = ("diamond", "main", "extended", "experts")


def gpqa_permutation(record_id: str, seed: int) -> list[int]:
    """Display order of the four GPQA options for one item: position → original index (0 = correct,
    k = "Incorrect Answer k"). Seeded by the record id and `seed` only, so it is the same in every run
    and independent of which other items are loaded."""
    rng = np.random.default_rng([int(seed) & 0xFFFFFFFF, _stable_int(record_id)])
    return [int(i) for i in rng.permutation(4)]


def load_gpqa(root: PathLike, *, subset: str = "diamond", seed: int = 0) -> list[Task]:
    """GPQA (diamond 198), read from the password-protected zip in memory. Options are shuffled per item
    (`gpqa_permutation`); metadata keeps the permutation and the option texts in display order."""
    if subset not in _GPQA_SUBSETS:
        raise ValueError(f"gpqa subset must be one of {_GPQA_SUBSETS}, got {subset!r}")
    zpath = _path(root, "gpqa", "idavidrein_gpqa_via_fork", "dataset.zip")
    member = f"dataset/gpqa_{subset}.csv"
    try:
        with zipfile.ZipFile(zpath) as z:
            raw = z.read(member, pwd=GPQA_PASSWORD).decode("utf-8")
    except KeyError:
        raise DataError(f"{zpath}: no member {member}") from None
    except (zipfile.BadZipFile, RuntimeError, UnicodeDecodeError, OSError) as e:  # RuntimeError: bad password
        raise DataError(f"{zpath}:{member}: cannot read ({e})") from None
    cols = ["Question", "Correct Answer", "Incorrect Answer 1", "Incorrect Answer 2", "Incorrect Answer 3", "Record ID"]
    reader = csv.DictReader(io.StringIO(raw, newline=""))
    missing = [c for c in cols if c not in (reader.fieldnames or [])]
    if missing:
        raise DataError(f"{zpath}:{member}: missing columns {missing}")
    tasks = []
    try:
        for r, rec in enumerate(reader, start=1):
            rid = (rec["Record ID"] or "").strip()
            where = f"{zpath}:{member}: row {r}" + (f" ({rid})" if rid else "")
            for c in cols:
                if not (rec[c] or "").strip():
                    raise DataError(f"{where}: empty column {c!r}")
            original = [rec[c].strip() for c in cols[1:5]]
            perm = gpqa_permutation(rid, seed)
            options = [original[i] for i in perm]
            letter = CHOICE_LETTERS[perm.index(0)]
            tasks.append(
                Task(
                    id=f"gpqa/{rid}",
                    source="gpqa",
                    prompt=(format_choice_prompt(rec["Question"], options),),
                    grader="choice",
                    answer=letter,
                    metadata={
                        "subset": subset,
                        "record_id": rid,
                        "question": rec["Question"].strip(),
                        "choices": options,
                        "permutation": perm,
                        "shuffle_seed": seed,
                        "domain": (rec.get("High-level domain") or "").strip(),
                        "subdomain": (rec.get("Subdomain") or "").strip(),
                    },
                )
            )
    except csv.Error as e:
        raise DataError(f"{zpath}:{member}: malformed CSV near row {reader.line_num} ({e})") from None
    return _check_unique(tasks, f"{zpath}:{member}")


# ---------------------------------------------------------------------------------------------------
# Open-ended (judge)

MT_BENCH_REFERENCE_CATEGORIES = ("math", "reasoning", "coding")  # FastChat's NEED_REF_CATS


def load_mt_bench(root: PathLike) -> list[Task]:
    """MT-Bench: 80 two-turn questions. metadata["reference"] = GPT-4 reference turns (FastChat's
    reference_answer/gpt-4.jsonl; required for math, reasoning and coding), metadata["question_reference"]
    = the short reference some questions carry inline."""
    qpath = _path(root, "mt_bench", "lm-sys_FastChat", "question.jsonl")
    rpath = _path(root, "mt_bench", "lm-sys_FastChat", "reference_answer", "gpt-4.jsonl")
    refs: dict[int, list[str]] = {}
    for n, rec in _iter_jsonl(rpath):
        where = f"{rpath}: line {n}"
        qid = _field(rec, "question_id", int, where)
        choices = _field(rec, "choices", list, where)
        turns = choices[0].get("turns") if choices and isinstance(choices[0], dict) else None
        if not (isinstance(turns, list) and all(isinstance(t, str) for t in turns)):
            raise DataError(f"{where} (question {qid}): choices[0].turns should be a list of strings")
        refs[qid] = turns
    tasks = []
    for n, rec in _iter_jsonl(qpath):
        where = f"{qpath}: line {n}"
        qid = _field(rec, "question_id", int, where)
        where = f"{where} (question {qid})"
        category = _field(rec, "category", str, where)
        turns = _field(rec, "turns", list, where)
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
    return _check_unique(tasks, qpath)


# ---------------------------------------------------------------------------------------------------
# Code


def load_humaneval(root: PathLike) -> list[Task]:
    """HumanEval (164). The prompt asks for the completed function; tests = the `check` code."""
    path = _path(root, "humaneval", "openai_human-eval", "HumanEval.jsonl.gz")
    tasks = []
    for n, rec in _iter_jsonl(path, gz=True):
        where = f"{path}: line {n}"
        tid = _nonempty(_field(rec, "task_id", str, where), "task_id", where)
        where = f"{where} ({tid})"
        fprompt = _nonempty(_field(rec, "prompt", str, where), "prompt", where)
        entry = _nonempty(_field(rec, "entry_point", str, where), "entry_point", where)
        test = _nonempty(_field(rec, "test", str, where), "test", where)
        if "def check(" not in test:
            raise DataError(f"{where}: test code defines no check(candidate)")
        prompt = (
            f"Complete the following Python function `{entry}`. Reply with the full implementation "
            "(including the signature and any imports) in one ```python code block.\n\n"
            f"```python\n{fprompt.rstrip()}\n```"
        )
        tasks.append(
            Task(
                id=f"humaneval/{tid}",
                source="humaneval",
                prompt=(prompt,),
                grader="code",
                tests=test,
                metadata={
                    "task_id": tid,
                    "test_format": "humaneval",
                    "entry_point": entry,
                    "function_prompt": fprompt,
                    "reference_solution": fprompt + _field(rec, "canonical_solution", str, where),
                },
            )
        )
    return _check_unique(tasks, path)


MBPP_SPLITS = {"prompt": (1, 10), "test": (11, 510), "validation": (511, 600), "train": (601, 974)}


def _quiet_parse(code: str) -> ast.Module:
    """ast.parse without the DeprecationWarnings MBPP's old escape sequences ('\\d' in plain strings) raise."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return ast.parse(code)


def _called_names(asserts: list[str]) -> list[str]:
    names = []
    for a in asserts:
        try:
            tree = _quiet_parse(a)
        except SyntaxError:
            continue
        names += [n.func.id for n in ast.walk(tree) if isinstance(n, ast.Call) and isinstance(n.func, ast.Name)]
    return names


def _mbpp_entry_point(code: str, asserts: list[str]) -> str | None:
    """The function the asserts exercise: the first top-level def of the reference that they call."""
    called = set(_called_names(asserts))
    try:
        defs = [n.name for n in _quiet_parse(code).body if isinstance(n, (ast.FunctionDef, ast.ClassDef))]
    except SyntaxError:
        return None
    return next((d for d in defs if d in called), None)


def load_mbpp(root: PathLike, *, split: str = "test") -> list[Task]:
    """MBPP (test = task ids 11-510, 500 problems). Prompt = the MBPP paper's: description + the three asserts."""
    if split not in MBPP_SPLITS:
        raise ValueError(f"mbpp split must be one of {tuple(MBPP_SPLITS)}, got {split!r}")
    lo, hi = MBPP_SPLITS[split]
    path = _path(root, "mbpp", "patdfb_TPC-EES_copy_of_google-research_mbpp", "mbpp.jsonl")
    tasks = []
    for n, rec in _iter_jsonl(path):
        where = f"{path}: line {n}"
        tid = _field(rec, "task_id", int, where)
        if not lo <= tid <= hi:
            continue
        where = f"{where} (task {tid})"
        text = _nonempty(_field(rec, "text", str, where), "text", where)
        code = _field(rec, "code", str, where)
        asserts = _field(rec, "test_list", list, where)
        if not asserts or not all(isinstance(a, str) and a.strip() for a in asserts):
            raise DataError(f"{where}: 'test_list' should be a non-empty list of assert strings")
        setup = rec.get("test_setup_code") or ""
        if not isinstance(setup, str):
            raise DataError(f"{where}: 'test_setup_code' should be a string")
        listing = "\n".join(asserts)
        prompt = (
            f"You are an expert Python programmer, and here is your task: {text.strip()} "
            f"Your code should pass these tests:\n\n{listing}\n\n"
            "Reply with the code in one ```python code block."
        )
        tests = (setup.strip() + "\n" if setup.strip() else "") + listing + "\n"
        tasks.append(
            Task(
                id=f"mbpp/{tid}",
                source="mbpp",
                prompt=(prompt,),
                grader="code",
                tests=tests,
                metadata={
                    "task_id": tid,
                    "split": split,
                    "test_format": "assert",
                    "entry_point": _mbpp_entry_point(code, asserts),
                    "test_list": asserts,
                    "test_setup_code": setup,
                    "challenge_test_list": list(rec.get("challenge_test_list") or []),
                    "reference_solution": code,
                },
            )
        )
    return _check_unique(tasks, path)


_LCB_HEAD = (
    "You will be given a question (problem specification) and will generate a correct Python program that "
    "matches the specification and passes all tests.\n\nQuestion: {problem}\n\n"
)
_LCB_STDIN = (
    "Read the inputs from stdin solve the problem and write the answer to stdout (do not directly test on the "
    "sample inputs). Enclose your code within delimiters as follows. Ensure that when the python program runs, it "
    "reads the inputs, runs the algorithm and writes output to STDOUT.\n```python\n# YOUR CODE HERE\n```\n\n"
)
_LCB_STARTER = (
    "You will use the following starter code to write the solution to the problem and enclose your code within "
    "delimiters.\n```python\n{starter}\n```\n\n"
)


def _lcb_prompt(problem: str, starter: str) -> str:
    tail = _LCB_STARTER.format(starter=starter) if starter else _LCB_STDIN
    return _LCB_HEAD.format(problem=problem) + tail


def _norm_ws(s: str) -> str:
    return " ".join(s.split())


def load_livecodebench(root: PathLike, *, subset: str = "all") -> list[Task]:
    """LiveCodeBench with **public tests only** (the DeepCoder/rllm copy: 879 problems). Hidden tests live only
    on the HF hub, so a pass here is "passes the public examples", not the official LCB metric.

    The 279 problems of the LCB v5 window (QwQ's list, 2024-08 … 2025-01) get their LCB question id and date;
    the others have no id in the source and get "rllm-<sha256(problem)[:12]>". subset="v5" keeps only the 279."""
    if subset not in ("all", "v5"):
        raise ValueError(f"livecodebench subset must be 'all' or 'v5', got {subset!r}")
    path = _path(root, "livecodebench", "winnieyangwannan_rllm_deepcoder_public_tests", "livecodebench.json")
    qpath = _path(root, "livecodebench", "QwenLM_QwQ", "livecodebench_v5.jsonl")
    data = _read_json(path)
    if not isinstance(data, list):
        raise DataError(f"{path}: expected a JSON list of problems, got {type(data).__name__}")
    by_prompt: dict[str, dict] = {}
    for n, rec in _iter_jsonl(qpath):
        where = f"{qpath}: line {n}"
        for k in ("question_id", "prompt", "contest_date"):
            _field(rec, k, str, where)
        by_prompt[_norm_ws(rec["prompt"])] = rec
    tasks = []
    for i, rec in enumerate(data):
        where = f"{path}: record {i}"
        if not isinstance(rec, dict):
            raise DataError(f"{where}: expected an object, got {type(rec).__name__}")
        problem = _nonempty(_field(rec, "problem", str, where), "problem", where)
        starter = _field(rec, "starter_code", str, where)
        raw_tests = _field(rec, "tests", (str, list), where)
        if isinstance(raw_tests, str):
            try:  # stored as a Python literal (single quotes), not JSON
                raw_tests = ast.literal_eval(raw_tests)
            except (ValueError, SyntaxError) as e:
                raise DataError(f"{where}: 'tests' is not a list literal ({e})") from None
        if not isinstance(raw_tests, list) or not raw_tests:
            raise DataError(f"{where}: 'tests' should be a non-empty list")
        tests = []
        for j, t in enumerate(raw_tests):
            if not (isinstance(t, dict) and isinstance(t.get("input"), str) and isinstance(t.get("output"), str)
                    and t.get("testtype") in ("stdin", "functional")):
                raise DataError(f"{where}: test {j} should be {{input: str, output: str, testtype: stdin|functional}}")
            tests.append({"input": t["input"], "output": t["output"], "testtype": t["testtype"]})
        kinds = {t["testtype"] for t in tests}
        if len(kinds) != 1:
            raise DataError(f"{where}: mixed test types {sorted(kinds)}")
        testtype = kinds.pop()
        fn_name = None
        if testtype == "functional":
            m = re.search(r"def\s+(\w+)\s*\(\s*self", starter)
            if not m:
                raise DataError(f"{where}: functional tests but no method in starter_code")
            fn_name = m.group(1)
        prompt = _lcb_prompt(problem, starter)
        q = by_prompt.get(_norm_ws(prompt))
        meta: dict[str, Any] = {
            "test_format": "io",
            "testtype": testtype,
            "fn_name": fn_name,
            "entry_point": fn_name,
            "starter_code": starter,
            "problem": problem,
            "public_tests_only": True,
            "hidden_tests": "not staged: LiveCodeBench private tests are only on the HF hub "
                            "(livecodebench/code_generation_lite)",
        }
        if q is not None:
            native = q["question_id"]
            meta.update(question_id=native, contest_id=q.get("contest_id"), contest_date=q["contest_date"],
                        lcb_window="v5")
        else:
            if subset == "v5":
                continue
            native = f"rllm-{_short_hash(problem)}"
        meta["platform"] = _lcb_platform(meta.get("question_id"), testtype)
        tasks.append(Task(id=f"livecodebench/{native}", source="livecodebench", prompt=(prompt,), grader="code",
                          tests=json.dumps(tests), metadata=meta))
    if subset == "v5" and len(tasks) != len(by_prompt):
        raise DataError(f"{path}: only {len(tasks)} of the {len(by_prompt)} problems in {qpath} were found")
    return _check_unique(tasks, path)


def _lcb_platform(question_id: str | None, testtype: str) -> str:
    if question_id:
        return "atcoder" if re.match(r"(abc|arc|agc)\d+_", question_id) else "leetcode"
    return "leetcode" if testtype == "functional" else "atcoder/codeforces"


# BigCodeBench: the staged file is v0.1.0_hf. These are the upstream data fixes up to v0.1.5
# (bigcode-project/bigcodebench tools/fix_v019.py → v0.1.1, fix_v0110.py → v0.1.2, fix_v022.py → v0.1.3,
# fix_v023.py → v0.1.4, fix_v025.py → v0.1.5), re-applied as exact text edits. Each edit is idempotent:
# a record that already carries the new text (a newer download) is left alone.
BIGCODEBENCH_VERSIONS = ("v0.1.0_hf", "v0.1.1", "v0.1.2", "v0.1.3", "v0.1.4", "v0.1.5")
_PROMPT_KEYS = ("complete_prompt", "instruct_prompt", "code_prompt")
_CODE_START = "\nYou should write self-contained code starting with:\n```\n"


def _replace(rec: dict, keys, old: str, new: str) -> None:
    for k in keys:
        v = rec.get(k)
        # When `new` extends `old`, a record that already has `new` is patched already; otherwise
        # replacing removes every `old`, so a second pass finds nothing to do.
        if isinstance(v, str) and old in v and not (old in new and new in v):
            rec[k] = v.replace(old, new)


def _prepend(rec: dict, keys, prefix: str) -> None:
    for k in keys:
        v = rec.get(k)
        if isinstance(v, str) and not v.startswith(prefix):
            rec[k] = prefix + v


def _nltk_fix(rec: dict, download: str, *, instruct: bool = True) -> None:
    line = f"import nltk\nnltk.download('{download}')\n"
    _prepend(rec, ("code_prompt", "complete_prompt"), line)
    if instruct:
        _replace(rec, ("instruct_prompt",), _CODE_START, _CODE_START + line)


def _fix_1006(rec: dict) -> None:
    old = (
        '    def test_valid_zip_url(self):\n        """Test a valid ZIP URL."""\n'
        '        url = "https://getsamplefiles.com/download/zip/sample-1.zip"\n        result = task_func(url)\n'
        '        self.assertTrue(result.startswith("mnt/data/downloads/"))\n'
        '        self.assertTrue(result.endswith("sample-1"))\n        shutil.rmtree("mnt/data/downloads")\n'
    )
    new = (
        '    @patch("requests.get")\n    def test_non_zip_content(self, mock_get):\n        """Test a valid ZIP URL."""\n'
        "        mock_get.return_value.status_code = 200\n"
        '        mock_get.return_value.headers = {"Content-Type": "application/zip"}\n'
        '        mock_get.return_value.content = b"1"\n        url = "https://valid-url.com/sample.zip"\n'
        "        result = task_func(url)\n"
    )
    _replace(rec, ("test",), old, new)


def _fix_211_215(rec: dict) -> None:
    if rec["task_id"] == "BigCodeBench/211":
        old = "\n        mock_response = MagicMock()\n        mock_response.content = MOCK_CONTENT\n"
        _replace(rec, ("test",), old, old + "        mock_response.status_code = 200\n")
    elif "mock_response.json = lambda: json.loads(MOCK_TEXT)" not in rec["test"]:  # 215, not yet patched
        # (the three edits interact — the third re-creates the second's pattern — so guard them as a unit)
        _replace(rec, ("test",), "\n        mock_response = Mock()\n",
                 "\n        mock_response = Mock()\n        mock_response.status_code = 200\n")
        _replace(rec, ("test",), "\n        mock_response.text =", "\n        MOCK_TEXT =")
        _replace(rec, ("test",), "\n        mock_get.return_value = mock_response\n",
                 "\n        mock_response.text = MOCK_TEXT\n        mock_response.json = lambda: json.loads(MOCK_TEXT)\n"
                 "        mock_get.return_value = mock_response\n")
    if rec["task_id"] == "BigCodeBench/215":
        _replace(rec, ("complete_prompt", "instruct_prompt", "doc_struct"), "Thif function will raise",
                 "This function will raise")


def _fix_1005(rec: dict) -> None:
    keys = [k for k, v in rec.items() if isinstance(v, str)]
    _replace(rec, keys, "https://getsamplefiles.com/download/zip/sample-2.zip",
             "https://getsamplefiles.com/download/zip/sample-5.zip")
    _replace(rec, keys, "sample_2", "sample_5")
    _replace(rec, keys, "Sample 2", "Sample 5")


def _fix_37(rec: dict) -> None:
    # Upstream prepends the import to every *prompt* field, instruct_prompt included.
    _prepend(rec, _PROMPT_KEYS, "import pandas as pd\n")
    _replace(rec, _PROMPT_KEYS, "Requirements:\n    - sklearn.ensemble\n",
             "Requirements:\n    - pandas\n    - sklearn.ensemble\n")


_BCB_PATCHES: list[tuple[str, str, Callable[[dict], None]]] = [
    ("v0.1.1", "BigCodeBench/178", lambda r: (_replace(r, [k for k, v in r.items() if isinstance(v, str)],
                                                          "from urllib import request\n", ""),
                                              _replace(r, [k for k, v in r.items() if isinstance(v, str)],
                                                       "    - urllib.request\n", ""))),
    ("v0.1.1", "BigCodeBench/760", lambda r: _replace(r, _PROMPT_KEYS, "from datetime import datetime",
                                                      "import datetime")),
    ("v0.1.1", "BigCodeBench/1006", _fix_1006),
    ("v0.1.2", "BigCodeBench/37", _fix_37),
    ("v0.1.3", "BigCodeBench/211", _fix_211_215),
    ("v0.1.3", "BigCodeBench/215", _fix_211_215),
    ("v0.1.3", "BigCodeBench/1005", _fix_1005),
    ("v0.1.5", "BigCodeBench/332", lambda r: _nltk_fix(r, "stopwords")),
    ("v0.1.5", "BigCodeBench/334", lambda r: _nltk_fix(r, "punkt")),
    ("v0.1.5", "BigCodeBench/376", lambda r: (
        _replace(r, ("code_prompt", "complete_prompt"), "import nltk\n", "import nltk\nnltk.download('stopwords')\n"),
        _replace(r, ("instruct_prompt",), _CODE_START + "import nltk\n",
                 _CODE_START + "import nltk\nnltk.download('stopwords')\n"))),
    ("v0.1.5", "BigCodeBench/383", lambda r: _nltk_fix(r, "punkt")),
    ("v0.1.5", "BigCodeBench/633", lambda r: _nltk_fix(r, "stopwords", instruct=False)),  # upstream: no-op on instruct
    ("v0.1.5", "BigCodeBench/635", lambda r: _replace(
        r, _PROMPT_KEYS, "# Importing the required libraries",
        "# Importing the required libraries\nimport nltk\nnltk.download('stopwords')\n")),
    ("v0.1.5", "BigCodeBench/849", lambda r: _nltk_fix(r, "stopwords", instruct=False)),
    ("v0.1.5", "BigCodeBench/940", lambda r: _nltk_fix(r, "punkt")),
    ("v0.1.5", "BigCodeBench/1109", lambda r: _nltk_fix(r, "punkt")),
]


def _patch_bigcodebench(rec: dict, version: str) -> dict:
    target = BIGCODEBENCH_VERSIONS.index(version)
    for v, tid, fix in _BCB_PATCHES:
        if rec["task_id"] == tid and BIGCODEBENCH_VERSIONS.index(v) <= target:
            fix(rec)
    return rec


def _bcb_records(root: PathLike, version: str) -> tuple[Path, list[tuple[int, dict]]]:
    if version not in BIGCODEBENCH_VERSIONS:
        raise ValueError(f"bigcodebench version must be one of {BIGCODEBENCH_VERSIONS}, got {version!r}")
    path = _path(root, "bigcodebench", "bigcodebench-annotation", "hf_data", "BigCodeBench.jsonl.gz")
    out = []
    for n, rec in _iter_jsonl(path, gz=True):
        where = f"{path}: line {n}"
        tid = _nonempty(_field(rec, "task_id", str, where), "task_id", where)
        where = f"{where} ({tid})"
        for k in ("complete_prompt", "instruct_prompt", "code_prompt", "test", "entry_point", "canonical_solution"):
            _nonempty(_field(rec, k, str, where), k, where)
        if "class TestCases" not in rec["test"]:
            raise DataError(f"{where}: test code defines no TestCases class")
        out.append((n, _patch_bigcodebench(dict(rec), version)))
    return path, out


def _bcb_task(source: str, rec: dict, prompt_style: str, version: str, where: str) -> Task:
    tid = rec["task_id"]
    libs = rec.get("libs")
    if isinstance(libs, str):
        try:
            libs = ast.literal_eval(libs)
        except (ValueError, SyntaxError):
            raise DataError(f"{where}: 'libs' is not a list literal") from None
    prompt = rec["instruct_prompt"] if prompt_style == "instruct" else (
        "Complete the following Python function. Reply with the whole program (imports, the function and any "
        f"helpers) in one ```python code block.\n\n```python\n{rec['complete_prompt'].rstrip()}\n```"
    )
    return Task(
        id=f"{source}/{tid}",
        source=source,
        prompt=(prompt,),
        grader="code",
        tests=rec["test"],
        metadata={
            "task_id": tid,
            "test_format": "unittest",
            "entry_point": rec["entry_point"],
            "code_prompt": rec["code_prompt"],
            "libs": list(libs or []),
            "prompt_style": prompt_style,
            "version": version,
            "reference_solution": rec["code_prompt"] + rec["canonical_solution"],
        },
    )


def load_bigcodebench(root: PathLike, *, prompt_style: str = "instruct", version: str = "v0.1.5") -> list[Task]:
    """BigCodeBench full (1140), staged as v0.1.0_hf and patched up to `version` (see _BCB_PATCHES).
    prompt_style "instruct" (natural-language task, the chat setting) or "complete" (docstring completion)."""
    if prompt_style not in ("instruct", "complete"):
        raise ValueError(f"prompt_style must be 'instruct' or 'complete', got {prompt_style!r}")
    path, recs = _bcb_records(root, version)
    return _check_unique([_bcb_task("bigcodebench", r, prompt_style, version, f"{path}: line {n}")
                          for n, r in recs], path)


def load_bigcodebench_hard(root: PathLike, *, prompt_style: str = "instruct", version: str = "v0.1.5") -> list[Task]:
    """BigCodeBench-Hard (148): the full-set records whose ids are in derived/bigcodebench_hard_task_ids.json."""
    if prompt_style not in ("instruct", "complete"):
        raise ValueError(f"prompt_style must be 'instruct' or 'complete', got {prompt_style!r}")
    ids_path = _path(root, "bigcodebench", "derived", "bigcodebench_hard_task_ids.json")
    ids = _read_json(ids_path)
    if not (isinstance(ids, list) and all(isinstance(i, str) for i in ids)):
        raise DataError(f"{ids_path}: expected a JSON list of task id strings")
    if len(set(ids)) != len(ids):
        raise DataError(f"{ids_path}: duplicate task ids")
    path, recs = _bcb_records(root, version)
    by_id = {r["task_id"]: (n, r) for n, r in recs}
    missing = [i for i in ids if i not in by_id]
    if missing:
        raise DataError(f"{ids_path}: ids not in {path}: {missing[:5]}")
    return [_bcb_task("bigcodebench_hard", by_id[i][1], prompt_style, version, f"{path}: line {by_id[i][0]}")
            for i in sorted(ids, key=lambda s: int(s.rsplit("/", 1)[-1]))]


# ---------------------------------------------------------------------------------------------------

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
