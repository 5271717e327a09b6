"""Benchmark loaders against the real staged data (TRINITY_DATA_DIR, default ../shared/benchmarks)."""
from __future__ import annotations

import csv
import gzip
import io
import json
import shutil
import zipfile
from collections import Counter
from pathlib import Path

import pytest

from trinity.data import (
    BENCHMARKS,
    DataError,
    default_root,
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
from trinity.data.loaders import GPQA_PASSWORD
from trinity.records import Task

@pytest.fixture(scope="module")
def loaded(root) -> dict[str, list[Task]]:
    """Every registered benchmark with default arguments, loaded once for the module."""
    return {name: load_benchmark(name, root) for name in BENCHMARKS}


# ----------------------------------------------------------------------------------------- counts

OFFICIAL = {
    "math500": 500,
    "aime": 60,
    "gpqa": 198,
    "mt_bench": 80,
    "humaneval": 164,
    "mbpp": 500,
    "bigcodebench": 1140,
    "bigcodebench_hard": 148,
    "mmlu": 14042,
    "gsm8k": 1319,
    "livecodebench": 879,  # the rllm copy with public tests (not an official LCB count)
}


@pytest.mark.parametrize("name", sorted(OFFICIAL))
def test_official_counts(loaded, name):
    assert len(loaded[name]) == OFFICIAL[name]


def test_every_task_is_well_formed(loaded):
    graders = {"math500": "math", "aime": "math", "gsm8k": "math", "mmlu": "choice", "gpqa": "choice",
               "mt_bench": "judge", "humaneval": "code", "mbpp": "code", "livecodebench": "code",
               "bigcodebench": "code", "bigcodebench_hard": "code"}
    for name, tasks in loaded.items():
        assert len({t.id for t in tasks}) == len(tasks), name
        for t in tasks:
            assert t.source == name and t.id.startswith(f"{name}/") and t.grader == graders[name]
            assert t.prompt and all(isinstance(p, str) and p.strip() for p in t.prompt)
            if t.grader in ("math", "choice"):
                assert t.answer
            if t.grader == "code":
                assert t.tests and t.metadata["test_format"] in ("humaneval", "assert", "unittest", "io")
            json.dumps(t.to_json())  # metadata must stay JSON-serialisable for save_tasks
    sample = loaded["gpqa"][0]
    assert Task.from_json(json.loads(json.dumps(sample.to_json()))) == sample


def test_other_splits_counts(root):
    assert len(load_gsm8k(root, split="train")) == 7473
    assert len(load_mmlu(root, split="dev")) == 285
    assert len(load_mmlu(root, split="val")) == 1531
    assert len(load_mbpp(root, split="train")) == 374
    assert len(load_livecodebench(root, subset="v5")) == 279


# ----------------------------------------------------------------------------------------- per benchmark


def test_math500(loaded, root):
    tasks = loaded["math500"]
    assert Counter(t.metadata["level"] for t in tasks) == {1: 43, 2: 90, 3: 105, 4: 128, 5: 134}
    t = tasks[0]
    assert t.id == "math500/test/precalculus/807.json"
    assert t.answer == "\\left( 3, \\frac{\\pi}{2} \\right)"
    assert t.metadata["problem"] in t.query and "\\boxed{}" in t.query
    easy = load_math500(root, max_level=2)
    assert len(easy) == 133 and all(t.metadata["level"] <= 2 for t in easy)


def test_gsm8k_answers(loaded, root):
    tasks = loaded["gsm8k"]
    assert tasks[0].id == "gsm8k/test-0" and tasks[0].answer == "18"
    assert all("," not in t.answer and t.answer.lstrip("-").isdigit() for t in tasks)
    # "#### 2,125" in the source → "2125"
    raw = [json.loads(line) for line in open(root / "gsm8k/openai_grade-school-math/test.jsonl", encoding="utf-8")]
    with_commas = [i for i, r in enumerate(raw) if "," in r["answer"].split("####")[-1]]
    assert with_commas and all("," not in tasks[i].answer for i in with_commas)
    train = load_gsm8k(root, split="train")
    assert not {t.metadata["problem"] for t in train} & {t.metadata["problem"] for t in tasks}


def test_aime(loaded):
    tasks = loaded["aime"]
    assert Counter(t.metadata["year"] for t in tasks) == {2024: 30, 2025: 30}
    assert Counter((t.metadata["year"], t.metadata["contest"]) for t in tasks) == {
        (2024, "I"): 15, (2024, "II"): 15, (2025, "I"): 15, (2025, "II"): 15}
    by_id = {t.id: t for t in tasks}
    assert by_id["aime/2024-I-1"].answer == "204"
    assert by_id["aime/2024-I-2"].answer == "25"  # "025" in the Qwen2.5-Math file
    assert by_id["aime/2025-I-1"].answer == "70"
    assert all(t.answer == str(int(t.answer)) and 0 <= int(t.answer) <= 999 for t in tasks)
    assert all(not t.metadata["problem"].endswith("\\boxed{}.") for t in tasks)  # QwQ instruction stripped once
    assert all(t.query.count("\\boxed{}") == 1 for t in tasks)


def _gpqa_rows(root: Path) -> dict[str, dict]:
    with zipfile.ZipFile(root / "gpqa/idavidrein_gpqa_via_fork/dataset.zip") as z:
        raw = z.read("dataset/gpqa_diamond.csv", pwd=GPQA_PASSWORD).decode("utf-8")
    return {r["Record ID"]: r for r in csv.DictReader(io.StringIO(raw))}


def test_gpqa_shuffle_is_seeded_and_keeps_the_gold(loaded, root):
    tasks = loaded["gpqa"]
    rows = _gpqa_rows(root)
    for t in tasks:
        r = rows[t.metadata["record_id"]]
        opts = t.metadata["choices"]
        assert opts[ord(t.answer) - 65] == r["Correct Answer"].strip()
        assert sorted(opts) == sorted(r[k].strip() for k in
                                      ("Correct Answer", "Incorrect Answer 1", "Incorrect Answer 2", "Incorrect Answer 3"))
        assert sorted(t.metadata["permutation"]) == [0, 1, 2, 3]
        for letter, opt in zip("ABCD", opts):
            assert f"{letter}) {opt}" in t.query
    # same seed → same order (another load, another process order); another seed → other orders
    again = load_gpqa(root, seed=0)
    assert [t.metadata["permutation"] for t in again] == [t.metadata["permutation"] for t in tasks]
    other = load_gpqa(root, seed=1)
    assert sum(a.answer != b.answer for a, b in zip(tasks, other)) > 100
    # the gold position is spread over all four letters
    assert min(Counter(t.answer for t in tasks).values()) >= 30
    # fixed value: the permutation depends only on (record id, seed)
    assert gpqa_permutation("rec06pnAkLOr2t2mp", 0) == tasks[0].metadata["permutation"] == [1, 0, 3, 2]


def test_mmlu(loaded, root):
    tasks = loaded["mmlu"]
    assert len({t.metadata["subject"] for t in tasks}) == 57
    assert set(Counter(t.answer for t in tasks)) == set("ABCD")
    t = tasks[0]
    assert t.id == "mmlu/test/abstract_algebra/1" and t.answer == "B"
    assert t.metadata["question"] in t.query and "A) 0" in t.query and "D) 6" in t.query and "Answer: X" in t.query
    few = load_mmlu(root, n_shot=3, subjects=["abstract_algebra"])
    assert len(few) == 100 and few[0].query.count("\nAnswer: ") == 3
    assert "Find all c in Z_3" in few[0].query  # the first dev example


def test_mt_bench(loaded):
    tasks = loaded["mt_bench"]
    assert all(len(t.prompt) == 2 for t in tasks)
    assert Counter(t.metadata["category"] for t in tasks) == {c: 10 for c in (
        "writing", "roleplay", "reasoning", "math", "coding", "extraction", "stem", "humanities")}
    with_ref = [t for t in tasks if t.metadata["reference"]]
    assert len(with_ref) == 30 and all(len(t.metadata["reference"]) == 2 for t in with_ref)
    assert all(t.metadata["reference"] for t in tasks if t.metadata["needs_reference"])
    assert tasks[0].id == "mt_bench/81"


def test_code_benchmarks(loaded):
    he = loaded["humaneval"]
    assert he[0].id == "humaneval/HumanEval/0"
    assert all(t.metadata["function_prompt"].rstrip() in t.query for t in he)
    # the tests really test: reference solutions pass (a few, in-process; the sandbox is another module)
    for t in he[:5]:
        exec(t.metadata["reference_solution"] + "\n" + t.tests + f"\ncheck({t.metadata['entry_point']})", {})
    mb = loaded["mbpp"]
    assert [t.metadata["task_id"] for t in mb] == list(range(11, 511))
    assert all(t.metadata["entry_point"] and t.metadata["entry_point"] in t.query for t in mb)
    for t in mb[:5]:
        exec(t.metadata["reference_solution"] + "\n" + t.tests, {})
    lcb = loaded["livecodebench"]
    for t in lcb:
        tests = json.loads(t.tests)
        assert tests and {x["testtype"] for x in tests} == {t.metadata["testtype"]}
        assert (t.metadata["fn_name"] is not None) == (t.metadata["testtype"] == "functional")
        assert t.metadata["public_tests_only"] and "hub" in t.metadata["hidden_tests"]
    v5 = [t for t in lcb if t.metadata.get("lcb_window") == "v5"]
    assert len(v5) == 279 and "livecodebench/abc365_b" in {t.id for t in v5}


def test_bigcodebench(loaded, root):
    full, hard = loaded["bigcodebench"], loaded["bigcodebench_hard"]
    full_ids = {t.metadata["task_id"] for t in full}
    assert len(full_ids) == 1140 and {t.metadata["task_id"] for t in hard} <= full_ids
    assert hard[0].id == "bigcodebench_hard/BigCodeBench/13"
    assert all(t.metadata["entry_point"] == "task_func" and "class TestCases" in t.tests for t in full)
    by = {t.metadata["task_id"]: t for t in full}
    # upstream fixes re-applied (v0.1.0_hf → v0.1.5)
    assert "Thif" not in by["BigCodeBench/215"].query
    assert "sample-1.zip" not in by["BigCodeBench/1006"].tests
    assert "urllib" not in by["BigCodeBench/178"].metadata["code_prompt"]
    assert "nltk.download('stopwords')" in by["BigCodeBench/332"].metadata["code_prompt"]
    raw = {t.metadata["task_id"]: t for t in load_bigcodebench(root, version="v0.1.0_hf")}
    assert "Thif" in raw["BigCodeBench/215"].query
    changed = {k for k in by if by[k].query != raw[k].query or by[k].tests != raw[k].tests
               or by[k].metadata["code_prompt"] != raw[k].metadata["code_prompt"]}
    assert len(changed) == 16
    complete = load_bigcodebench_hard(root, prompt_style="complete")
    assert all(t.metadata["code_prompt"].strip().splitlines()[0] in t.query for t in complete)


def test_dispatcher_and_root(root, monkeypatch):
    with pytest.raises(ValueError, match="unknown benchmark"):
        load_benchmark("nope", root)
    monkeypatch.setenv("TRINITY_DATA_DIR", str(root))
    assert default_root() == root
    assert len(load_benchmark("aime", years=(2025,))) == 30  # root from the environment


# ----------------------------------------------------------------------------------------- malformed files


def _write(path: Path, text: str | bytes) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    (path.write_bytes if isinstance(text, bytes) else path.write_text)(text)
    return path


def _math_line(**kw) -> str:
    rec = {"problem": "1+1?", "solution": "", "answer": "2", "subject": "Algebra", "level": 1,
           "unique_id": "test/algebra/1.json", **kw}
    return json.dumps({k: v for k, v in rec.items() if v is not None})


def test_missing_file_names_the_file(tmp_path):
    with pytest.raises(DataError, match=r"math500.*test\.jsonl: file not found"):
        load_math500(tmp_path)


def test_bad_json_line_names_file_and_line(tmp_path):
    p = _write(tmp_path / "math500/hkust-nlp_simpleRL-reason/test.jsonl",
               _math_line() + "\n" + _math_line(unique_id="b") + "\n{not json\n")
    with pytest.raises(DataError, match=r"test\.jsonl: line 3: not valid JSON") as e:
        load_math500(tmp_path)
    assert str(p) in str(e.value)


def test_missing_field_and_bad_type(tmp_path):
    path = tmp_path / "math500/hkust-nlp_simpleRL-reason/test.jsonl"
    _write(path, _math_line() + "\n" + _math_line(unique_id="test/x/2.json", answer=None) + "\n")
    with pytest.raises(DataError, match=r"line 2 \(test/x/2.json\): missing field 'answer'"):
        load_math500(tmp_path)
    _write(path, _math_line(level="hard") + "\n")
    with pytest.raises(DataError, match=r"line 1 .*'level' should be int"):
        load_math500(tmp_path)
    _write(path, _math_line() + "\n" + _math_line() + "\n")
    with pytest.raises(DataError, match="duplicate record id 'math500/test/algebra/1.json'"):
        load_math500(tmp_path)


def test_gsm8k_without_marker(tmp_path):
    _write(tmp_path / "gsm8k/openai_grade-school-math/test.jsonl",
           json.dumps({"question": "q", "answer": "x\n#### 5"}) + "\n\n" + json.dumps({"question": "q2", "answer": "no"}))
    with pytest.raises(DataError, match=r"test\.jsonl: line 3: answer should contain exactly one '####'"):
        load_gsm8k(tmp_path)


def test_aime_bad_answer(tmp_path, root):
    src = root / "aime/qwen25math_aime24/test.jsonl"
    lines = src.read_text(encoding="utf-8").splitlines()
    rec = json.loads(lines[4])
    rec["answer"] = "forty"
    lines[4] = json.dumps(rec)
    _write(tmp_path / "aime/qwen25math_aime24/test.jsonl", "\n".join(lines) + "\n")
    with pytest.raises(DataError, match=r"line 5: AIME answer 'forty'"):
        load_aime(tmp_path, years=(2024,))


def test_mmlu_bad_row_names_member_and_row(tmp_path):
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w") as z:
        z.writestr("data/test/anatomy_test.csv", 'q1,a,b,c,d,A\n"q2",a,b,c,B\n')
    _write(tmp_path / "mmlu/hiyouga_LLaMA-Factory/mmlu.zip", buf.getvalue())
    with pytest.raises(DataError, match=r"mmlu\.zip:data/test/anatomy_test\.csv: row 2: expected 6 columns"):
        load_mmlu(tmp_path)
    _write(tmp_path / "mmlu/hiyouga_LLaMA-Factory/mmlu.zip", b"not a zip")
    with pytest.raises(DataError, match="not a valid zip"):
        load_mmlu(tmp_path)


def test_gpqa_bad_zip(tmp_path):
    zpath = tmp_path / "gpqa/idavidrein_gpqa_via_fork/dataset.zip"
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w") as z:
        z.writestr("dataset/gpqa_main.csv", "Question\nq\n")
    _write(zpath, buf.getvalue())
    with pytest.raises(DataError, match="no member dataset/gpqa_diamond.csv"):
        load_gpqa(tmp_path)
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w") as z:
        z.writestr("dataset/gpqa_diamond.csv",
                   "Question,Correct Answer,Incorrect Answer 1,Incorrect Answer 2,Incorrect Answer 3,Record ID\n"
                   "q,a,b,c,d,rec1\nq,a,b,,d,rec2\n")
    _write(zpath, buf.getvalue())
    with pytest.raises(DataError, match=r"row 2 \(rec2\): empty column 'Incorrect Answer 2'"):
        load_gpqa(tmp_path)


def test_gz_and_mt_bench_errors(tmp_path, root):
    _write(tmp_path / "humaneval/openai_human-eval/HumanEval.jsonl.gz", b"\x1f\x8b garbage")
    with pytest.raises(DataError, match=r"HumanEval\.jsonl\.gz: cannot read"):
        load_humaneval(tmp_path)
    shutil.copytree(root / "mt_bench/lm-sys_FastChat", tmp_path / "mt_bench/lm-sys_FastChat")
    q = tmp_path / "mt_bench/lm-sys_FastChat/question.jsonl"
    lines = q.read_text(encoding="utf-8").splitlines()
    rec = json.loads(lines[1])
    rec["turns"] = rec["turns"][:1]
    lines[1] = json.dumps(rec)
    q.write_text("\n".join(lines) + "\n", encoding="utf-8")
    with pytest.raises(DataError, match=r"line 2 \(question 82\): 'turns' should be two"):
        load_mt_bench(tmp_path)


def test_code_loader_errors(tmp_path, root):
    lcb = tmp_path / "livecodebench"
    shutil.copytree(root / "livecodebench/QwenLM_QwQ", lcb / "QwenLM_QwQ")
    _write(lcb / "winnieyangwannan_rllm_deepcoder_public_tests/livecodebench.json",
           json.dumps([{"problem": "p", "starter_code": "", "tests": "[{'input': '1', 'output': '1', 'testtype': 'stdin'}]"},
                       {"problem": "p2", "starter_code": "", "tests": "[{'input': "}]))
    with pytest.raises(DataError, match=r"livecodebench\.json: record 1: 'tests' is not a list literal"):
        load_livecodebench(tmp_path)
    bcb = tmp_path / "bigcodebench"
    shutil.copytree(root / "bigcodebench/bigcodebench-annotation/hf_data", bcb / "bigcodebench-annotation/hf_data")
    _write(bcb / "derived/bigcodebench_hard_task_ids.json", json.dumps(["BigCodeBench/13", "BigCodeBench/99999"]))
    with pytest.raises(DataError, match=r"bigcodebench_hard_task_ids\.json: ids not in .*BigCodeBench/99999"):
        load_bigcodebench_hard(tmp_path)
    with gzip.open(root / "bigcodebench/bigcodebench-annotation/hf_data/BigCodeBench.jsonl.gz", "rt") as f:
        first = json.loads(f.readline())
    del first["test"]
    _write(bcb / "bigcodebench-annotation/hf_data/BigCodeBench.jsonl.gz",
           gzip.compress((json.dumps(first) + "\n").encode()))
    with pytest.raises(DataError, match=r"line 1 \(BigCodeBench/0\): missing field 'test'"):
        load_bigcodebench(tmp_path)
