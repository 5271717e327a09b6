"""Keep a profile run's outputs in git: copy the report, results and plots the pipeline just wrote into
reports/<name>/ and write run.json beside them (the commit, the CPU, the wall time, the overrides), so that the figures
of `make run-full` are committed with the run that printed them while reports/ itself stays the default run's.

    python scripts/keep_profile.py full_profile --started <unix seconds> [--earlier-sitting-min M ...]
        [--set key=value ...]

Run by `make run-full` after its `dvc exp run`; it fails, naming the file, when an output is missing.
"""
from __future__ import annotations

import argparse
import json
import shutil
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

KEPT = {  # source (project-relative) -> name in reports/<profile>/
    "reports/summary.md": "summary.md",
    "reports/traces.md": "traces.md",
    "reports/plots": "plots",
    "data/eval/results.json": "results.json",
    "reports/metrics/evaluate.json": "eval_metrics.json",
    "reports/metrics/evolve.json": "evolve_metrics.json",
    "reports/metrics/router.json": "router_metrics.json",
}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("name", help="the folder under reports/, e.g. full_profile")
    ap.add_argument("--started", type=float, required=True, help="unix time the run started (wall time)")
    ap.add_argument("--earlier-sitting-min", action="append", type=float, default=[], metavar="MINUTES",
                    help="wall minutes of an earlier sitting of this run, when it was stopped and resumed from its "
                         "store (repeat per sitting): run.json then gives every sitting and their sum")
    ap.add_argument("--set", action="append", default=[], metavar="KEY=VALUE", help="a params override of the run")
    args = ap.parse_args(argv)

    from trinity.machine import commit, cpu_kind

    from trinity.code_version import code_version

    missing = [src for src in KEPT if not (ROOT / src).exists()]
    if missing:
        print(f"keep_profile: the run left no {', '.join(missing)} (did `dvc exp run` finish?)", file=sys.stderr)
        return 1
    out = ROOT / "reports" / args.name
    out.mkdir(parents=True, exist_ok=True)
    for src, name in KEPT.items():
        dest = out / name
        if (ROOT / src).is_dir():
            shutil.rmtree(dest, ignore_errors=True)
            shutil.copytree(ROOT / src, dest)
        else:
            shutil.copy2(ROOT / src, dest)
    wall = time.time() - args.started
    evolve = json.loads((ROOT / "reports/metrics/evolve.json").read_text())
    run = {"profile": args.name, "commit": commit(), "code_version": code_version(), "cpu": cpu_kind(),
           "wall_s": round(wall, 1), "wall_min": round(wall / 60, 1), "overrides": args.set,
           "evolve_calls_made": evolve.get("calls_made"), "evolve_store_hits": evolve.get("store_hits"),
           "note": "wall time of this `make run-full` invocation (setup excluded); a resumed run counts only its "
                   "last sitting here, and its sittings below when they were given"}
    if args.earlier_sitting_min:
        sittings = [*args.earlier_sitting_min, round(wall / 60, 1)]
        run.update(sittings_min=sittings, wall_min_all_sittings=round(sum(sittings), 1))
    (out / "run.json").write_text(json.dumps(run, indent=2) + "\n")
    print(json.dumps(run))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
