"""Sandbox overhead: one trivial program in the bubblewrap sandbox vs. a plain subprocess running
the same interpreter on the same file, measured interleaved (plain, sandboxed, plain, ...), medians
over the repetitions. Also the grading throughput on this machine's cores: trivial programs through
`Sandbox.run_many`, and HumanEval reference solutions through `grade_code` (when the data is there).

Run: .venv/bin/python -m bench.sandbox [--reps 30]. The last line is the JSON record.
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from trinity.grading.sandbox import Sandbox, SandboxJob

PROGRAM = "import sys\nprint(sum(range(1000)))\n"


def plain_run(path: str) -> float:
    t0 = time.perf_counter()
    out = subprocess.run([sys.executable, "-B", "-s", path], capture_output=True, text=True, timeout=60,
                         env={"PATH": "/usr/bin:/bin"}, cwd=os.path.dirname(path))
    dt = time.perf_counter() - t0
    assert out.returncode == 0 and out.stdout.strip() == "499500", out.stderr
    return dt


def sandbox_run(sb: Sandbox) -> float:
    t0 = time.perf_counter()
    r = sb.run(PROGRAM)
    dt = time.perf_counter() - t0
    assert r.ok and r.stdout.strip() == "499500", r.stderr
    return dt


def throughput_trivial(sb: Sandbox, n: int, workers: int) -> float:
    t0 = time.perf_counter()
    results = sb.run_many([SandboxJob(PROGRAM) for _ in range(n)], workers=workers)
    dt = time.perf_counter() - t0
    assert all(r.ok for r in results)
    return n / dt


def throughput_humaneval(n: int, workers: int) -> float | None:
    try:
        from trinity.data.loaders import load_benchmark
        from trinity.grading.check import as_answer
        from trinity.grading.code import grade_code

        tasks = load_benchmark("humaneval")[:n]
    except Exception:
        return None
    t0 = time.perf_counter()
    with ThreadPoolExecutor(workers) as pool:
        scores = list(pool.map(lambda t: grade_code(t, as_answer(t.metadata["reference_solution"])), tasks))
    dt = time.perf_counter() - t0
    assert all(s == 1.0 for s in scores)
    return len(tasks) / dt


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--reps", type=int, default=30)
    ap.add_argument("--throughput-n", type=int, default=40)
    ap.add_argument("--throughput-reps", type=int, default=3)
    args = ap.parse_args()

    sb = Sandbox(timeout_s=30)
    mode = sb.mode()
    workers = os.cpu_count() or 1
    with tempfile.TemporaryDirectory() as d:
        path = str(Path(d) / "main.py")
        Path(path).write_text(PROGRAM)
        for _ in range(3):  # warm-up: page cache, the availability probe
            plain_run(path)
            sandbox_run(sb)
        plain, boxed = [], []
        for i in range(args.reps):
            if i % 2 == 0:
                plain.append(plain_run(path))
                boxed.append(sandbox_run(sb))
            else:
                boxed.append(sandbox_run(sb))
                plain.append(plain_run(path))
    tp_trivial = [throughput_trivial(sb, args.throughput_n, workers) for _ in range(args.throughput_reps)]
    tp_he = [x for x in (throughput_humaneval(args.throughput_n, workers) for _ in range(args.throughput_reps))
             if x is not None]

    med_boxed = statistics.median(boxed) * 1000
    med_plain = statistics.median(plain) * 1000
    overhead = statistics.median(b - p for b, p in zip(boxed, plain)) * 1000
    detail = {
        "mode": mode,
        "median_sandboxed_ms": round(med_boxed, 2),
        "median_plain_ms": round(med_plain, 2),
        "median_paired_overhead_ms": round(overhead, 2),
        "p90_sandboxed_ms": round(sorted(boxed)[int(0.9 * (len(boxed) - 1))] * 1000, 2),
        "repetitions": args.reps,
        "workers": workers,
        "throughput_trivial_programs_per_s": round(statistics.median(tp_trivial), 2),
        "throughput_trivial_runs": [round(x, 2) for x in tp_trivial],
        "throughput_humaneval_grades_per_s": round(statistics.median(tp_he), 2) if tp_he else None,
        "throughput_humaneval_runs": [round(x, 2) for x in tp_he],
        "throughput_batch": args.throughput_n,
        "program": PROGRAM.strip(),
    }
    print(f"sandboxed {med_boxed:.1f} ms, plain {med_plain:.1f} ms, overhead {med_boxed - med_plain:.1f} ms; "
          f"{detail['throughput_trivial_programs_per_s']} programs/s, "
          f"{detail['throughput_humaneval_grades_per_s']} HumanEval grades/s on {workers} workers")
    print(json.dumps({
        "name": "sandbox_overhead",
        "figure": round(med_boxed - med_plain, 2),
        "unit": "ms",
        "goal": "report",
        "compared_to": "plain subprocess run of the same trivial program",
        "detail": detail,
    }))


if __name__ == "__main__":
    main()
