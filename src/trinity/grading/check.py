"""`trinity check-graders`: prove the code graders on the benchmarks' own reference solutions.

For each benchmark, every task's reference solution is wrapped as a model answer (in a ```python
fence, so extraction is exercised too) and graded in the real sandbox: it must pass. Then the same
solution with its entry point's return value changed (a wrapper that perturbs the result) must fail
— a grader that passes everything would pass the first check alone.

Prints one JSON line per benchmark:
  {"benchmark": "humaneval", "passed": 164, "total": 164, "pass_rate": 1.0, "required": 1.0, "ok": true,
   "failures": [{"id": ..., "reason": ...}], "negative": {"total": ..., "failed": ..., "still_passed": [...]},
   "seconds": ...}
Exit status 0 when every benchmark meets its required pass rate (and, where one is set, its
negative-check rate), else 1.

Run: `python -m trinity.grading.check [--benchmarks humaneval,mbpp,bigcodebench_hard] [--limit N]`.
LiveCodeBench is not here: the staged copy has no reference solutions.
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Sequence

from trinity.grading.code import CodeVerdict, grade_code_detail
from trinity.grading.sandbox import SandboxUnavailable
from trinity.records import Task


@dataclass(frozen=True)
class Requirement:
    pass_rate: float  # reference solutions that must pass
    negative_rate: float | None  # perturbed solutions that must fail (None: reported only)
    note: str = ""


REQUIREMENTS: dict[str, Requirement] = {
    "humaneval": Requirement(1.0, 1.0),
    "mbpp": Requirement(0.99, 0.99),
    # Some BigCodeBench tests check only side effects (files written, plots drawn), so a changed return
    # value can legitimately still pass: the negative check is reported, not required.
    "bigcodebench_hard": Requirement(0.95, None, "needs scripts/setup_sandbox_env.sh"),
}
DEFAULT_BENCHMARKS = ("humaneval", "mbpp", "bigcodebench_hard")

# Appended after a reference solution: the entry point now returns a different value.
_PERTURB = '''

def _trinity_wrong(r):
    class _Wrong:
        def __eq__(self, other):
            return False
        __hash__ = object.__hash__
    if isinstance(r, bool):
        return not r
    if isinstance(r, (int, float)):
        return r + 1 + abs(r)
    if isinstance(r, complex):
        return r + 1
    if isinstance(r, str):
        return r + "\\x00changed"
    if isinstance(r, bytes):
        return r + b"\\x00"
    if isinstance(r, list):
        return r + [_Wrong()]
    if isinstance(r, tuple):
        return r + (_Wrong(),)
    if isinstance(r, (set, frozenset)):
        return type(r)(set(r) | {_Wrong()})
    if isinstance(r, dict):
        d = dict(r)
        d[_Wrong()] = _Wrong()
        return d
    if hasattr(r, "__next__"):
        return list(r) + [_Wrong()]
    return _Wrong()


_trinity_original = {entry}


def {entry}(*args, **kwargs):
    return _trinity_wrong(_trinity_original(*args, **kwargs))
'''


def as_answer(code: str) -> str:
    """A reference solution dressed as a chat model's reply."""
    return f"Here is the solution.\n\n```python\n{code.rstrip()}\n```\n"


def perturbed(task: Task) -> str | None:
    entry = task.metadata.get("entry_point")
    ref = task.metadata.get("reference_solution")
    if not entry or not ref or not str(entry).isidentifier():
        return None
    return ref.rstrip() + "\n" + _PERTURB.replace("{entry}", entry)


def _load(name: str, data_dir: str | None) -> list[Task]:
    from trinity.data.loaders import load_benchmark

    return load_benchmark(name, data_dir)


def check_benchmark(name: str, tasks: Sequence[Task], *, workers: int, negative: bool = True) -> dict:
    req = REQUIREMENTS.get(name, Requirement(1.0, None))
    jobs: list[tuple[str, Task, str]] = []
    for t in tasks:
        ref = t.metadata.get("reference_solution")
        if ref:
            jobs.append(("ref", t, as_answer(ref)))
        if negative:
            bad = perturbed(t)
            if bad is not None:
                jobs.append(("neg", t, as_answer(bad)))

    def grade(job: tuple[str, Task, str]) -> tuple[str, Task, CodeVerdict]:
        kind, task, answer = job
        try:
            return kind, task, grade_code_detail(task, answer)
        except SandboxUnavailable:
            raise
        except Exception as e:  # a grader bug must show up as a failure with its reason, not stop the run
            return kind, task, CodeVerdict(False, f"grader error: {type(e).__name__}: {e}")

    t0 = time.monotonic()
    with ThreadPoolExecutor(max_workers=max(1, workers)) as pool:
        results = list(pool.map(grade, jobs))
    ref_results = [(t, v) for k, t, v in results if k == "ref"]
    neg_results = [(t, v) for k, t, v in results if k == "neg"]
    passed = sum(v.passed for _, v in ref_results)
    total = len(tasks)
    rate = passed / total if total else 0.0
    neg_failed = sum(not v.passed for _, v in neg_results)
    neg_rate = neg_failed / len(neg_results) if neg_results else None
    ok = rate >= req.pass_rate and (
        req.negative_rate is None or not negative or (neg_rate is not None and neg_rate >= req.negative_rate))
    no_ref = [t.id for t in tasks if not t.metadata.get("reference_solution")]
    out = {
        "benchmark": name,
        "passed": passed,
        "total": total,
        "pass_rate": round(rate, 4),
        "required": req.pass_rate,
        "ok": ok,
        "failures": [{"id": t.id, "reason": v.reason} for t, v in ref_results if not v.passed]
        + [{"id": i, "reason": "no reference solution"} for i in no_ref],
    }
    if negative:
        out["negative"] = {
            "total": len(neg_results),
            "failed": neg_failed,
            "fail_rate": round(neg_rate, 4) if neg_rate is not None else None,
            "required": req.negative_rate,
            "still_passed": [t.id for t, v in neg_results if v.passed],
        }
    out["seconds"] = round(time.monotonic() - t0, 1)
    return out


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="trinity check-graders", description=__doc__.split("\n\n")[0])
    ap.add_argument("--benchmarks", default=",".join(DEFAULT_BENCHMARKS),
                    help="comma-separated: humaneval, mbpp, bigcodebench_hard, bigcodebench")
    ap.add_argument("--limit", type=int, default=None, help="only the first N tasks of each benchmark")
    ap.add_argument("--workers", type=int, default=os.cpu_count() or 1, help="concurrent sandboxes")
    ap.add_argument("--data-dir", default=None, help="benchmark root (default: TRINITY_DATA_DIR / params)")
    ap.add_argument("--no-negative", action="store_true", help="skip the perturbed-solution check")
    args = ap.parse_args(list(argv) if argv is not None else None)

    all_ok = True
    for name in [b.strip() for b in args.benchmarks.split(",") if b.strip()]:
        try:
            tasks = _load(name, args.data_dir)[: args.limit]
            line = check_benchmark(name, tasks, workers=args.workers, negative=not args.no_negative)
        except SandboxUnavailable as e:
            line = {"benchmark": name, "passed": 0, "total": 0, "ok": False, "error": str(e), "failures": []}
        except Exception as e:  # missing data and the like: say so on the benchmark's own line
            line = {"benchmark": name, "passed": 0, "total": 0, "ok": False,
                    "error": f"{type(e).__name__}: {e}", "failures": []}
        all_ok &= bool(line["ok"])
        print(json.dumps(line), flush=True)
    return 0 if all_ok else 1


if __name__ == "__main__":
    sys.exit(main())
