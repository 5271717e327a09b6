"""Seeded train / held-out splits, the contamination guard, and Task JSONL files.

The held-out benchmarks are the point of the evaluation (the paper's claim is zero-shot transfer), so
`build_splits` refuses to return a split in which a held-out source, a held-out task id, or a held-out
prompt text appears in training; in-distribution evaluation items are drawn from what training left.
"""
from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any, Iterable, Mapping, NamedTuple, Sequence

import numpy as np

from trinity.data.loaders import BENCHMARKS, DataError, PathLike
from trinity.data.loaders.reading import stable_int
from trinity.data.loaders.user import load_user_benchmark
from trinity.files import atomic_open
from trinity.records import Task

HELDOUT_SOURCES = frozenset({"aime", "bigcodebench", "bigcodebench_hard", "mt_bench", "gpqa"})
"""Benchmarks that must never be trained on (the paper's unseen set)."""

# "<name>:<value>" in a split spec sets this loader keyword; e.g. "gsm8k:train", "mmlu:val", "gpqa:main".
_VARIANT_KW = {"gsm8k": "split", "mmlu": "split", "mbpp": "split", "gpqa": "subset", "livecodebench": "subset"}
# Defaults when the spec names no variant: train on GSM8K's train split, evaluate on its test split.
_ROLE_DEFAULTS = {"train": {"gsm8k": "train"}, "heldout": {"gsm8k": "test"}, "in_distribution": {"gsm8k": "test"},
                  "validation": {"gsm8k": "train"}}


class ContaminationError(ValueError):
    """Training data overlaps the held-out data (by source, task id or prompt text)."""


def sample_tasks(tasks: Sequence[Task], n: int, seed: int | Sequence[int]) -> list[Task]:
    """`n` tasks drawn without replacement, the same for the same input set and seed in every run.

    The tasks are sorted by id first, so the draw does not depend on file or load order; then a seeded
    permutation (numpy default_rng) picks them. Smaller n gives a prefix of larger n's draw.
    n = -1 takes all of them (in the permuted order)."""
    ordered = sorted(tasks, key=lambda t: t.id)
    ids = [t.id for t in ordered]
    if len(set(ids)) != len(ids):
        dup = next(i for a, i in zip(ids, ids[1:]) if a == i)
        raise ValueError(f"duplicate task id {dup!r}: sample_tasks needs unique ids")
    if n == -1:
        n = len(ordered)
    if not 0 <= n <= len(ordered):
        raise ValueError(f"cannot draw {n} tasks from {len(ordered)}")
    perm = np.random.default_rng(seed).permutation(len(ordered))
    return [ordered[i] for i in perm[:n]]


def _parse_key(key: str, role: str, user: Mapping[str, Any] = {}) -> tuple[str, dict[str, Any]]:
    name, _, variant = key.partition(":")
    if name in user:
        if variant:
            raise ValueError(f"data.{role}: {name!r} is your own benchmark (data.user_benchmarks): it has no "
                             f"split/subset variants (got {key!r})")
        return name, {}
    if name not in BENCHMARKS:
        raise ValueError(f"data.{role}: unknown benchmark {name!r} (staged: {sorted(BENCHMARKS)}; yours, "
                         f"data.user_benchmarks: {sorted(user)})")
    variant = variant or _ROLE_DEFAULTS[role].get(name, "")
    if not variant:
        return name, {}
    if name not in _VARIANT_KW:
        raise ValueError(f"data.{role}: {name!r} has no split/subset variants (got {key!r})")
    return name, {_VARIANT_KW[name]: variant}


class Splits(NamedTuple):
    train: list[Task]
    in_distribution: list[Task]
    """Evaluation items of the training benchmarks that training did not draw."""
    heldout: list[Task]
    """Evaluation items of benchmarks never trained on."""
    validation: list[Task] = []
    """Items of the training benchmarks in neither training nor the in-distribution evaluation: what evolve selects
    the saved coordinator on (never an evaluation item)."""


def build_splits(
    root: PathLike,
    train: dict[str, int],
    heldout: dict[str, int],
    seed: int,
    math500_max_level: int = 5,
) -> tuple[list[Task], list[Task]]:
    """(train, held-out): `build_all_splits` without an in-distribution evaluation set."""
    s = build_all_splits(root, train, {}, heldout, seed, math500_max_level)
    return s.train, s.heldout


def build_all_splits(
    root: PathLike,
    train: dict[str, int],
    in_distribution: dict[str, int],
    heldout: dict[str, int],
    seed: int,
    math500_max_level: int = 5,
    user_benchmarks: Mapping[str, PathLike] | None = None,
    validation: dict[str, int] | None = None,
) -> Splits:
    """Load each named benchmark from `root` and draw the requested number of tasks from each (-1 = all).

    Keys are benchmark names, optionally "<name>:<split or subset>" (gsm8k defaults to its train split
    for training and its test split for evaluation). Each source is drawn with its own seed derived from
    (`seed`, key), so adding a source does not reshuffle the others. In-distribution items are drawn from what
    training left of the same benchmark (never a training item, by id or prompt text); a held-out benchmark
    may not be named there. Validation items (`validation`, e.g. {"math500": 10}) are drawn from what training and the
    in-distribution evaluation left of a training benchmark (never an item of either). MATH-500 is limited to problems of level ≤ `math500_max_level`; GPQA's option
    shuffle uses `seed` too. `user_benchmarks`: your own benchmarks, name → JSONL file (`loaders.user`), named in
    the specs like staged ones; one named under `heldout` is held out as a whole, like the mission's held-out
    benchmarks: never trained on, never drawn in-distribution. Raises ContaminationError if the result
    mixes training and evaluation data."""
    user = dict(user_benchmarks or {})
    for name in user:
        if name in BENCHMARKS:
            raise ValueError(f"data.user_benchmarks.{name}: {name!r} is a staged benchmark's name; pick another")
    if not 1 <= math500_max_level <= 5:
        raise ValueError(f"math500_max_level must be 1-5, got {math500_max_level}")
    cache: dict[tuple, list[Task]] = {}

    def draw(spec: dict[str, int], role: str, exclude: Sequence[Task] = ()) -> list[Task]:
        out: list[Task] = []
        excluded_ids = {t.id for t in exclude}
        excluded_texts = {x for t in exclude for x in _texts(t)}
        for key, n in spec.items():
            name, kw = _parse_key(key, role, user)
            if role in ("in_distribution", "validation") and (name in HELDOUT_SOURCES or name in heldout_names):
                raise ValueError(f"data.{role}.{key}: {name} is a held-out benchmark (never trained on); "
                                 "list it under data.heldout")
            if name == "math500":
                kw["max_level"] = math500_max_level
            if name == "gpqa":
                kw["seed"] = seed
            ck = (name, tuple(sorted(kw.items())))
            if ck not in cache:
                cache[ck] = load_user_benchmark(user[name], name) if name in user else BENCHMARKS[name](root, **kw)
            pool = [t for t in cache[ck] if t.id not in excluded_ids and not (_texts(t) & excluded_texts)]
            draw_seed = stable_int(f"{key}:{seed}" if role in ("train", "heldout") else f"{key}:{seed}:{role}")
            if role == "train" and any(t.grader == "judge" for t in pool):
                raise ValueError(f"data.train.{key}: {name} is judged (open questions, scored 1-10 by the MT-Bench "
                                 "judge); the training reward needs items graded right or wrong: list it under "
                                 "data.heldout")
            try:
                out += sample_tasks(pool, n, draw_seed)
            except ValueError as e:
                left = f" (after leaving out the {len(cache[ck]) - len(pool)} training items)" if exclude else ""
                raise ValueError(f"data.{role}.{key}: {e}{left}") from None
        return out

    # your own benchmark named under heldout is held out as a whole (it has no train/test variants, unlike GSM8K's)
    heldout_names = {name for key in heldout if (name := _parse_key(key, "heldout", user)[0]) in user}
    train_tasks = draw(train, "train")
    in_dist_tasks = draw(in_distribution, "in_distribution", exclude=train_tasks)
    heldout_tasks = draw(heldout, "heldout")
    for key in validation or {}:
        if _parse_key(key, "validation", user)[0] not in {_parse_key(k, "train", user)[0] for k in train}:
            raise ValueError(f"data.validation.{key}: not a training benchmark (data.train: {sorted(train)}); "
                             "validation selects on the benchmarks training draws from")
    val_tasks = draw(validation or {}, "validation", exclude=[*train_tasks, *in_dist_tasks])
    assert_no_contamination(train_tasks, [*in_dist_tasks, *heldout_tasks, *val_tasks], HELDOUT_SOURCES | heldout_names)
    assert_no_contamination(val_tasks, [*in_dist_tasks, *heldout_tasks], HELDOUT_SOURCES | heldout_names)
    return Splits(train_tasks, in_dist_tasks, heldout_tasks, val_tasks)


def splits_from_settings(data, **override) -> Splits:
    """`build_all_splits` with params.yaml's `data` section (a `config.DataSettings`): its benchmark root, specs,
    seed, MATH-500 level cap and your own benchmarks; any argument can be overridden by keyword."""
    kw = dict(root=data.resolved_root(), train=data.train, in_distribution=data.in_distribution,
              heldout=data.heldout, validation=data.validation, seed=data.seed, math500_max_level=data.math500_max_level,
              user_benchmarks=data.resolved_user_benchmarks())
    return build_all_splits(**(kw | override))


def _normalise(text: str) -> str:
    """Lower-case, only letters and digits: formatting differences do not hide a duplicate."""
    return re.sub(r"[\W_]+", "", text.lower())


def _texts(task: Task) -> set[str]:
    out = {_normalise("\n".join(task.prompt))}
    for k in ("problem", "question"):  # the bare problem, when a loader wrapped it in a template
        v = task.metadata.get(k)
        if isinstance(v, str) and len(_normalise(v)) >= 20:
            out.add(_normalise(v))
    return out


def assert_no_contamination(
    train: Iterable[Task], heldout: Iterable[Task], heldout_sources: Iterable[str] = HELDOUT_SOURCES
) -> None:
    """Raise ContaminationError if a held-out source is trained on, or if any task id or normalised
    prompt / problem text is in both sets."""
    train, heldout = list(train), list(heldout)
    bad_sources = sorted({t.source for t in train} & set(heldout_sources))
    if bad_sources:
        raise ContaminationError(f"held-out benchmarks in the training set: {bad_sources}")
    shared_ids = sorted({t.id for t in train} & {t.id for t in heldout})
    if shared_ids:
        raise ContaminationError(f"{len(shared_ids)} task ids in both training and held-out sets, e.g. {shared_ids[:5]}")
    seen: dict[str, str] = {}
    for t in train:
        for x in _texts(t):
            seen.setdefault(x, t.id)
    clashes = [(seen[x], t.id) for t in heldout for x in _texts(t) if x in seen]
    if clashes:
        raise ContaminationError(
            f"{len(clashes)} held-out tasks have the same prompt text as a training task, e.g. "
            + ", ".join(f"{h} = {tr}" for tr, h in clashes[:5])
        )


def save_tasks(path: PathLike, tasks: Iterable[Task]) -> Path:
    """Write tasks as JSONL (one Task.to_json object a line); atomic, so a crash leaves no half file."""
    path = Path(path)
    with atomic_open(path, "w", encoding="utf-8") as f:
        for t in tasks:
            f.write(json.dumps(t.to_json(), ensure_ascii=False, sort_keys=True) + "\n")
    return path


def load_tasks(path: PathLike) -> list[Task]:
    """Read a file written by save_tasks; a bad line raises DataError with the file and line number."""
    path = Path(path)
    if not path.is_file():
        raise DataError(f"{path}: file not found")
    tasks = []
    with open(path, encoding="utf-8") as f:
        for n, line in enumerate(f, start=1):
            if not line.strip():
                continue
            try:
                d = json.loads(line)
                if not isinstance(d, dict):
                    raise TypeError(f"expected a JSON object, got {type(d).__name__}")
                t = Task.from_json(d)
                if not (isinstance(t.id, str) and isinstance(t.source, str) and t.prompt
                        and all(isinstance(p, str) for p in t.prompt)
                        and t.grader in ("math", "choice", "code", "judge")):
                    raise TypeError("id/source/prompt/grader have the wrong type or value")
            except json.JSONDecodeError as e:
                raise DataError(f"{path}: line {n}: not valid JSON ({e.msg})") from None
            except (KeyError, TypeError) as e:
                raise DataError(f"{path}: line {n}: not a Task record ({e})") from None
            tasks.append(t)
    ids = [t.id for t in tasks]
    if len(set(ids)) != len(ids):
        raise DataError(f"{path}: duplicate task ids")
    return tasks
