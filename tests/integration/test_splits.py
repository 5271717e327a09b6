"""Seeded sampling, train/held-out splits, the contamination guard and Task JSONL files (real data)."""
from __future__ import annotations

import json
import os
import random
import subprocess
import sys
from dataclasses import replace

import pytest

from trinity.data import (
    HELDOUT_SOURCES,
    ContaminationError,
    DataError,
    assert_no_contamination,
    build_splits,
    load_bigcodebench,
    load_bigcodebench_hard,
    load_math500,
    load_tasks,
    sample_tasks,
    save_tasks,
)
from trinity.records import Task

@pytest.fixture(scope="module")
def math500(root) -> list[Task]:
    return load_math500(root)


def test_heldout_sources():
    assert HELDOUT_SOURCES == {"aime", "bigcodebench", "bigcodebench_hard", "mt_bench", "gpqa"}


def test_sample_tasks_is_seeded_and_order_independent(math500):
    a = sample_tasks(math500, 20, seed=7)
    shuffled = list(math500)
    random.Random(1).shuffle(shuffled)
    assert [t.id for t in sample_tasks(shuffled, 20, seed=7)] == [t.id for t in a]
    assert [t.id for t in sample_tasks(math500, 5, seed=7)] == [t.id for t in a[:5]]  # prefix property
    assert [t.id for t in sample_tasks(math500, 20, seed=8)] != [t.id for t in a]
    assert len({t.id for t in a}) == 20
    assert len(sample_tasks(math500, -1, seed=0)) == 500
    with pytest.raises(ValueError, match="cannot draw 501 tasks from 500"):
        sample_tasks(math500, 501, seed=0)
    with pytest.raises(ValueError, match="duplicate task id"):
        sample_tasks([math500[0], math500[0]], 1, seed=0)


_CHILD = """
import json, sys
from trinity.data import build_splits
tr, ho = build_splits(sys.argv[1], {"math500": 6, "mmlu": 6}, {"gsm8k": 5, "gpqa": 3}, seed=3)
print(json.dumps([[t.id for t in tr], [t.id for t in ho], [t.answer for t in ho]]))
"""


def test_build_splits_stable_across_processes(root):
    """Another interpreter with another hash seed draws exactly the same split (and GPQA option order)."""
    train, heldout = build_splits(root, {"math500": 6, "mmlu": 6}, {"gsm8k": 5, "gpqa": 3}, seed=3)
    env = {**os.environ, "PYTHONHASHSEED": "12345"}
    out = subprocess.run([sys.executable, "-c", _CHILD, str(root)], capture_output=True, text=True, env=env,
                         timeout=120, check=True).stdout
    ids_train, ids_heldout, answers = json.loads(out.strip().splitlines()[-1])
    assert ids_train == [t.id for t in train]
    assert ids_heldout == [t.id for t in heldout]
    assert answers == [t.answer for t in heldout]


def test_build_splits_shapes_and_levels(root):
    train, heldout = build_splits(root, {"math500": 30, "mmlu": 10, "gsm8k": 5},
                                  {"gsm8k": 10, "aime": 4, "mt_bench": 2}, seed=0, math500_max_level=2)
    assert [t.source for t in train] == ["math500"] * 30 + ["mmlu"] * 10 + ["gsm8k"] * 5
    assert all(t.metadata["level"] <= 2 for t in train if t.source == "math500")
    assert all(t.metadata["split"] == "train" for t in train if t.source == "gsm8k")
    assert all(t.metadata["split"] == "test" for t in heldout if t.source == "gsm8k")
    assert [t.source for t in heldout] == ["gsm8k"] * 10 + ["aime"] * 4 + ["mt_bench"] * 2
    # adding a source does not change what the others draw
    train2, _ = build_splits(root, {"math500": 30, "mmlu": 10, "gsm8k": 5, "humaneval": 3}, {"gsm8k": 10},
                             seed=0, math500_max_level=2)
    assert [t.id for t in train2[:45]] == [t.id for t in train]
    # another seed, another draw
    train3, _ = build_splits(root, {"math500": 30}, {}, seed=1, math500_max_level=2)
    assert [t.id for t in train3] != [t.id for t in train[:30]]


def test_build_splits_refuses_contamination(root):
    with pytest.raises(ContaminationError, match=r"held-out benchmarks in the training set: \['aime'\]"):
        build_splits(root, {"math500": 2, "aime": 2}, {"gsm8k": 2}, seed=0)
    # the whole GSM8K test split in training, GSM8K test held out → shared ids
    with pytest.raises(ContaminationError, match="task ids in both"):
        build_splits(root, {"gsm8k:test": -1}, {"gsm8k": 5}, seed=0)
    with pytest.raises(ValueError, match="unknown benchmark 'nope'"):
        build_splits(root, {"nope": 1}, {}, seed=0)
    with pytest.raises(ValueError, match=r"data.train.math500: cannot draw 9999"):
        build_splits(root, {"math500": 9999}, {}, seed=0)


def test_guard_catches_same_prompt_under_another_id(math500):
    t = math500[0]
    twin = replace(t, id="other/1", source="other", prompt=("  " + t.query.upper().replace(" ", "   ") + " ",))
    with pytest.raises(ContaminationError, match="same prompt text"):
        assert_no_contamination([t], [twin])
    # the bare problem wrapped in another template is caught through metadata["problem"]
    wrapped = Task(id="x/1", source="x", prompt=("Solve: " + t.metadata["problem"] + "\nShow work.",), grader="math",
                   answer="1", metadata={"problem": t.metadata["problem"]})
    with pytest.raises(ContaminationError):
        assert_no_contamination([t], [wrapped])
    assert_no_contamination(math500[:100], math500[100:])  # disjoint: fine


def test_guard_sees_bigcodebench_hard_inside_full(root):
    full, hard = load_bigcodebench(root), load_bigcodebench_hard(root)
    with pytest.raises(ContaminationError, match="bigcodebench_hard/BigCodeBench/13 = bigcodebench/BigCodeBench/13"):
        assert_no_contamination(full, hard, heldout_sources=())


def test_save_and_load_tasks(tmp_path, root):
    train, heldout = build_splits(root, {"math500": 3, "mmlu": 3}, {"gpqa": 3, "mt_bench": 2}, seed=0)
    path = save_tasks(tmp_path / "sub" / "tasks.jsonl", train + heldout)
    back = load_tasks(path)
    assert back == train + heldout
    assert [t.metadata for t in back] == [t.metadata for t in train + heldout]
    assert not list(path.parent.glob(".*.tmp"))
    lines = path.read_text(encoding="utf-8").splitlines()
    path.write_text("\n".join(lines[:2] + ["{broken"] + lines[2:]) + "\n", encoding="utf-8")
    with pytest.raises(DataError, match=r"tasks\.jsonl: line 3: not valid JSON"):
        load_tasks(path)
    path.write_text(lines[0] + "\n" + json.dumps({"id": "a/1", "source": "a"}) + "\n", encoding="utf-8")
    with pytest.raises(DataError, match=r"line 2: not a Task record"):
        load_tasks(path)
    with pytest.raises(DataError, match="file not found"):
        load_tasks(tmp_path / "missing.jsonl")


def test_validation_is_drawn_from_what_training_and_evaluation_left(root):
    from trinity.data.splits import build_all_splits

    kw = dict(train={"math500": 5, "mmlu": 5}, in_distribution={"math500": 4, "mmlu": 4}, heldout={"gsm8k": 3},
              seed=0, math500_max_level=2)
    without = build_all_splits(root, **kw)
    s = build_all_splits(root, **kw, validation={"math500": 3, "mmlu": 3})
    assert (s.train, s.in_distribution, s.heldout) == (without.train, without.in_distribution, without.heldout)
    assert without.validation == [] and len(s.validation) == 6
    assert {t.source for t in s.validation} == {"math500", "mmlu"}
    taken = {t.id for t in [*s.train, *s.in_distribution, *s.heldout]}
    assert not taken & {t.id for t in s.validation}
    assert build_all_splits(root, **kw, validation={"math500": 3, "mmlu": 3}).validation == s.validation  # seeded
    with pytest.raises(ValueError, match="data.validation.gsm8k: not a training benchmark"):
        build_all_splits(root, **kw, validation={"gsm8k": 2})
    with pytest.raises(ValueError, match="data.validation.aime"):
        build_all_splits(root, **kw, validation={"aime": 2})
