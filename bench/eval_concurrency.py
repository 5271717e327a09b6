"""Evaluation at the machine's pace: the same evaluation one (benchmark, method) run at a time vs all at once.

The evaluate stage as the pipeline runs it (`trinity.stages.evaluate.run`: the coordinator, the learned router, each
member alone, random routing, the MT-Bench judge), on the default run's items and checkpoints (data/prepared,
data/checkpoints, data/router from `make run`), twice in this process: with TRINITY_EVAL_ONE_AT_A_TIME=1 (one run
after another) and all at once (the default). Each starts from a cleared store (a new DuckDB file: every call and
every encode paid again) and from freshly started llama-servers (no prompt cache carried over), with the pool's
connection retries off, so that any call the client loses to a dropped connection is counted, not hidden by another
attempt. The outputs go to a scratch root: the checkout's data/ and reports/ are only read.

Prints one JSON line: figure = wall time one at a time / wall time all at once (goal >= 1.5), with the transport
failures of each (goal 0), calls paid, per-call seconds and the CPU kind. Takes roughly as long as two evaluations of
the default run (~30-60 min on 2 cores); --benchmarks / --max-items shrink it (both modes get the same items).

    .venv/bin/python -m bench.eval_concurrency [--order serial,all] [--max-items N]
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

MODES = {"serial": "1", "all": ""}


def scratch_root(max_items: int | None) -> Path:
    """A project root whose data/ reads the run's prepared items and checkpoints (copied: small) and writes elsewhere."""
    tmp = Path(tempfile.mkdtemp(prefix="trinity-bench-eval-"))
    for sub in ("prepared", "checkpoints", "router"):
        src = ROOT / "data" / sub
        if not src.exists():
            if sub == "router":
                continue
            raise SystemExit(f"eval_concurrency: {src} is missing: run `make run` first (the bench evaluates the "
                             f"default run's items with its checkpoints)")
        shutil.copytree(src, tmp / "data" / sub)
    if max_items is not None:
        for f in (tmp / "data" / "prepared").glob("*.jsonl"):
            if f.name == "train.jsonl":
                continue
            kept, per = [], {}
            for line in f.read_text().splitlines():
                src = json.loads(line).get("source")
                per[src] = per.get(src, 0) + 1
                if per[src] <= max_items:
                    kept.append(line)
            f.write_text("".join(x + "\n" for x in kept))
    return tmp


def one_mode(mode: str, root: Path, settings) -> dict:
    from trinity.pool import llama_server
    from trinity.pool.llama_server import LLAMA_SERVERS
    from trinity.stages.evaluate import run as evaluate_stage
    from trinity.stages.paths import Paths

    LLAMA_SERVERS.stop_all()  # no slot's prompt cache carried from the other mode
    os.environ["TRINITY_EVAL_ONE_AT_A_TIME"] = MODES[mode]
    store = root / f"store-{mode}" / "trinity.duckdb"
    os.environ["TRINITY_STORE"] = str(store)
    llama_server.CONNECTION_RETRIES = 0
    t0 = time.monotonic()
    error = None
    try:
        evaluate_stage(settings, Paths(root))
    except Exception as e:  # an outage raises after writing: the counts below still tell
        error = f"{type(e).__name__}: {str(e)[:300]}"
    wall = time.monotonic() - t0
    results = json.loads((root / "data" / "eval" / "results.json").read_text())
    rows = [json.loads(x) for x in (root / "data" / "eval" / "episodes.jsonl").read_text().splitlines()]
    turns = [t for r in rows for t in r["turns"]]
    lost = [t["text"][:120] for t in turns if not t["ok"] and "connection" in (t["text"] or "").lower()]
    from trinity.store import Store

    with Store(store, read_only=True) as st:
        failures = st.con.execute("SELECT failure, error FROM failures").fetchall()
    transport = [e for _, e in failures if e and ("connection" in e.lower() or "transport" in e.lower())]
    return {"mode": mode, "wall_s": round(wall, 1), "eval_wall_s": results.get("wall_s"),
            "pool_calls": results.get("pool_calls"), "store_hits": results.get("store_hits"),
            "failed_calls": results.get("failed_calls"), "transient_failures": results.get("transient_failures"),
            "transport_failures": len(transport) + len(lost), "transport_examples": (transport + lost)[:3],
            "mean_call_s": round(sum(t["latency_s"] for t in turns) / max(1, len(turns)), 2),
            "items": len({(r["benchmark"], r["task_id"]) for r in rows}), "error": error}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--order", default="serial,all", help="the modes in the order they run (default serial,all)")
    ap.add_argument("--max-items", type=int, default=None, help="at most this many items per evaluation benchmark")
    args = ap.parse_args(argv)
    from trinity.machine import commit, cpu_kind

    from trinity.config import load_settings

    settings = load_settings(ROOT / "params.yaml")
    root = scratch_root(args.max_items)
    try:
        runs = {m: one_mode(m, root, settings) for m in args.order.split(",")}
    finally:
        shutil.rmtree(root, ignore_errors=True)
    serial, together = runs["serial"]["wall_s"], runs["all"]["wall_s"]
    failures = sum(r["transport_failures"] for r in runs.values())
    print(json.dumps({
        "name": "eval_concurrency", "figure": round(serial / together, 3), "unit": "x (wall, one at a time / all at once)",
        "goal": ">= 1.5, with 0 transport failures (pool retries off)",
        "compared_to": "the same evaluation one (benchmark, method) at a time, same session, cleared store each time",
        "transport_failures": failures, "commit": commit(), "cpu": cpu_kind(),
        "detail": {"runs": runs, "order": args.order, "max_items": args.max_items,
                   "pool_max_concurrency": settings.pool.max_concurrency}}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
