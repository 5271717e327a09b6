"""The code grader on real benchmark items, in the real sandbox: reference solutions pass, broken
ones fail, for HumanEval, MBPP, LiveCodeBench (stdin and functional) and BigCodeBench. The full
canonical runs (`trinity check-graders`) are marked slow."""
from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from trinity.grading.check import as_answer, check_benchmark, main as check_main, perturbed
from trinity.grading.code import _stdout_matches, extract_code, grade_code, grade_code_detail
from trinity.grading.sandbox import sandbox_python
from trinity.records import Task

PROJECT = Path(__file__).resolve().parents[2]
DATA = Path(os.environ.get("TRINITY_DATA_DIR") or PROJECT / ".." / "shared" / "benchmarks").resolve()
needs_data = pytest.mark.skipif(not DATA.is_dir(), reason=f"benchmark data not found at {DATA}")
needs_bcb_env = pytest.mark.skipif(sandbox_python() is None, reason="run scripts/setup_sandbox_env.sh first")


def _load(name: str, **kw) -> list[Task]:
    from trinity.data.loaders import load_benchmark

    return load_benchmark(name, DATA, **kw)


def _sample(tasks: list[Task], n: int) -> list[Task]:
    step = max(1, len(tasks) // n)
    return tasks[::step][:n]


# ------------------------------------------------------------------------------------------------
# Extraction and output comparison


def test_extract_prefers_the_block_defining_the_entry_point():
    text = (
        "<think>maybe ```python\nwrong()\n```</think>Sure!\n```python\ndef helper():\n    return 1\n```\n"
        "Then:\n```python\ndef solve(x):\n    return helper() + x\n```\nUsage:\n```python\nprint(solve(2))\n```"
    )
    assert extract_code(text, "solve") == "def solve(x):\n    return helper() + x"
    assert extract_code(text) == "def solve(x):\n    return helper() + x"  # longest block


def test_extract_variants():
    assert extract_code("```\nprint(1)\n```") == "print(1)"  # unlabelled
    assert extract_code("```py\nx = 1\n```\n```text\nnot code\n```") == "x = 1"
    assert extract_code("```python\ndef f():\n    return 1\n") == "def f():\n    return 1"  # cut off
    assert extract_code("def f():\n    return 2\n") == "def f():\n    return 2"  # no fences
    assert extract_code("```bash\nls\n```") == ""
    assert extract_code("````python\ns = '```'\n````") == "s = '```'"


def test_stdout_comparison():
    assert _stdout_matches("1 2\n3\n", "1 2\n3")
    assert _stdout_matches("  1 2  \n3\n\n", "1 2\n3\n")
    assert _stdout_matches("0.50\n", "0.5\n")
    assert not _stdout_matches("1 2\n", "1 3\n")
    assert not _stdout_matches("1\n2\n", "1\n")
    assert not _stdout_matches("YES\n", "yes\n")


# ------------------------------------------------------------------------------------------------
# HumanEval


@needs_data
def test_humaneval_reference_passes_and_broken_fails():
    tasks = _sample(_load("humaneval"), 10)
    for t in tasks:
        assert grade_code(t, as_answer(t.metadata["reference_solution"])) == 1.0, t.id
        v = grade_code_detail(t, as_answer(perturbed(t)))
        assert not v.passed, t.id


@needs_data
def test_humaneval_completion_styles():
    t = _load("humaneval")[0]
    fprompt = t.metadata["function_prompt"]
    body = t.metadata["reference_solution"][len(fprompt):]
    assert grade_code(t, body) == 1.0  # a raw continuation of the prompt (the original HumanEval setting)
    assert grade_code(t, f"```python\n{body}\n```") == 1.0  # a fenced body
    # The whole function without the prompt's imports: they come from the prompt.
    full = t.metadata["reference_solution"].replace("from typing import List\n", "")
    assert grade_code(t, as_answer(full)) == 1.0
    assert grade_code(t, "I don't know.") == 0.0
    assert grade_code(t, "") == 0.0 and grade_code(t, None) == 0.0
    # Exiting early with status 0 is not a pass.
    assert grade_code(t, as_answer(t.metadata["reference_solution"] + "\nimport sys\nsys.exit(0)\n")) == 0.0


@needs_data
def test_dispatch_from_grading_package():
    from trinity.grading import grade

    t = _load("humaneval")[2]
    assert grade(t, as_answer(t.metadata["reference_solution"])) == 1.0


# ------------------------------------------------------------------------------------------------
# MBPP


@needs_data
def test_mbpp_reference_passes_and_broken_fails():
    tasks = _sample(_load("mbpp"), 10)
    for t in tasks:
        assert grade_code(t, as_answer(t.metadata["reference_solution"])) == 1.0, t.id
        bad = perturbed(t)
        if bad is not None:
            assert grade_code(t, as_answer(bad)) == 0.0, t.id
    t = tasks[0]
    assert grade_code(t, as_answer("def unrelated():\n    return 0\n")) == 0.0


# ------------------------------------------------------------------------------------------------
# LiveCodeBench (public tests)

LCB_STDIN = {
    # N copies of the digit N
    "livecodebench/rllm-39a3d90a25ed": ("n = input().strip()\nprint(n * int(n))\n", "print(input())\n"),
    # A^B + B^A
    "livecodebench/rllm-fbd738b9e9ac": (
        "def main():\n    a, b = map(int, input().split())\n    print(a ** b + b ** a)\n\n"
        "if __name__ == '__main__':\n    main()\n",
        "a, b = map(int, input().split())\nprint(a ** b * b ** a)\n",
    ),
    # numbers <= N with exactly 9 divisors: p^8 or p^2 q^2
    "livecodebench/abc383_d": (
        "import sys\nfrom math import isqrt\n"
        "def primes(n):\n    s = bytearray([1]) * (n + 1); s[0:2] = b'\\x00\\x00'\n"
        "    for i in range(2, isqrt(n) + 1):\n        if s[i]: s[i*i::i] = bytearray(len(s[i*i::i]))\n"
        "    return [i for i in range(n + 1) if s[i]]\n"
        "N = int(sys.stdin.readline())\nr = isqrt(N)\nps = primes(r + 1)\ncnt = 0\n"
        "for p in ps:\n    if p ** 8 <= N: cnt += 1\n"
        "import bisect\n"
        "for i, p in enumerate(ps):\n    lim = isqrt(N // (p * p)) if p * p <= N else 0\n"
        "    if lim <= p: break\n    cnt += bisect.bisect_right(ps, lim) - i - 1\n"
        "print(cnt)\n",
        "print(3)\n",
    ),
}


@needs_data
def test_livecodebench_stdin():
    by_id = {t.id: t for t in _load("livecodebench")}
    for tid, (good, bad) in LCB_STDIN.items():
        t = by_id[tid]
        assert t.metadata["testtype"] == "stdin"
        v = grade_code_detail(t, as_answer(good))
        assert v.passed, (tid, v.reason)
        v = grade_code_detail(t, as_answer(bad))
        assert not v.passed and "case" in v.reason, tid


@needs_data
def test_livecodebench_functional():
    t = {t.id: t for t in _load("livecodebench")}["livecodebench/3676"]
    assert t.metadata["testtype"] == "functional" and t.metadata["fn_name"] == "smallestNumber"
    good = ("class Solution:\n    def smallestNumber(self, n: int) -> int:\n        x = 1\n"
            "        while x < n:\n            x = 2 * x + 1\n        return x\n")
    v = grade_code_detail(t, as_answer(good))
    assert v.passed, v.reason
    assert not grade_code_detail(t, as_answer(good.replace("2 * x + 1", "2 * x"))).passed
    v = grade_code_detail(t, as_answer("def smallestNumber(n):\n    return n\n"))
    assert not v.passed and "Solution" in v.reason


# ------------------------------------------------------------------------------------------------
# BigCodeBench (needs the sandbox venv)

BCB_SAMPLE = ("BigCodeBench/13", "BigCodeBench/100", "BigCodeBench/1006")


@needs_data
@needs_bcb_env
def test_bigcodebench_reference_passes_and_broken_fails():
    hard = {t.metadata["task_id"]: t for t in _load("bigcodebench_hard")}
    for tid in BCB_SAMPLE:
        t = hard[tid]
        v = grade_code_detail(t, as_answer(t.metadata["reference_solution"]))
        assert v.passed, (tid, v.reason)
    t = hard[BCB_SAMPLE[1]]
    v = grade_code_detail(t, as_answer(perturbed(t)))
    assert not v.passed and "test_" in v.reason


# ------------------------------------------------------------------------------------------------
# The full canonical runs


@pytest.mark.slow
@needs_data
def test_check_graders_humaneval_and_mbpp_full():
    for name, required in (("humaneval", 1.0), ("mbpp", 0.99)):
        line = check_benchmark(name, _load(name), workers=os.cpu_count() or 1)
        assert line["pass_rate"] >= required, json.dumps(line)[:2000]
        assert line["negative"]["fail_rate"] >= required, line["negative"]


@pytest.mark.slow
@needs_data
@needs_bcb_env
def test_check_graders_bigcodebench_hard_full(capsys):
    assert check_main(["--benchmarks", "bigcodebench_hard", "--data-dir", str(DATA)]) == 0
    line = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert line["pass_rate"] >= 0.95
