"""Multiple-choice benchmarks: MMLU, GPQA (grader "choice")."""
from __future__ import annotations

import csv
import io
import zipfile
from pathlib import Path

import numpy as np

from trinity.data.loaders.reading import DataError, PathLike, check_unique, read_json, require_file, stable_int
from trinity.records import Task

CHOICE_LETTERS = "ABCD"


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
    zpath = require_file(root, "mmlu", "hiyouga_LLaMA-Factory", "mmlu.zip")
    names_path = Path(root) / "mmlu" / "hiyouga_LLaMA-Factory" / "mapping.json"
    mapping = read_json(names_path) if names_path.is_file() else {}
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
    return check_unique(tasks, zpath)


def _mmlu_question_block(row: list[str]) -> str:
    return row[0].strip() + "\n" + "\n".join(f"{l}) {o.strip()}" for l, o in zip(CHOICE_LETTERS, row[1:5]))


GPQA_PASSWORD = b"deserted-untie-orchid"  # published in the GPQA README (README.upstream.md)
_GPQA_SUBSETS = ("diamond", "main", "extended", "experts")


def gpqa_permutation(record_id: str, seed: int) -> list[int]:
    """Display order of the four GPQA options for one item: position → original index (0 = correct,
    k = "Incorrect Answer k"). Seeded by the record id and `seed` only, so it is the same in every run
    and independent of which other items are loaded."""
    rng = np.random.default_rng([int(seed) & 0xFFFFFFFF, stable_int(record_id)])
    return [int(i) for i in rng.permutation(4)]


def load_gpqa(root: PathLike, *, subset: str = "diamond", seed: int = 0) -> list[Task]:
    """GPQA (diamond 198), read from the password-protected zip in memory. Options are shuffled per item
    (`gpqa_permutation`); metadata keeps the permutation and the option texts in display order."""
    if subset not in _GPQA_SUBSETS:
        raise ValueError(f"gpqa subset must be one of {_GPQA_SUBSETS}, got {subset!r}")
    zpath = require_file(root, "gpqa", "idavidrein_gpqa_via_fork", "dataset.zip")
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
    return check_unique(tasks, f"{zpath}:{member}")
