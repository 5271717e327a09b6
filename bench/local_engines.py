"""A generation's calls through each way of running the local models: llama-server with N threads, or in process.

A generation keeps calls to every member in flight at once, so the local models decode at the same time. This
replays the first --requests stored requests of a run (every member, in the order they were made;
`bench.common.stored_requests`) through the pool's own members at the pool's concurrency
(`pool.max_concurrency` in flight), once per setting of --settings:

- "auto": llama-server, each server with the pool's thread budget (`trinity.pool.llama_server.with_thread_budget`:
  the usable cores split between the models served) — the default;
- an integer N: llama-server, N threads per server (2 = every core of this machine for each of them);
- "in-process": llama-cpp-python in this process, 2 threads per model, one call at a time per model — the engine
  before issue 26.

Fresh servers (or loaded models) for each setting, started or loaded before the clock by an untimed warm-up call per
member. Printed per setting: aggregate completion tokens/s and wall time. Why threads matter: each server computes a
token with its threads meeting at a barrier after every operation, so more threads than cores in all means a
thread waiting for a sibling the OS has not scheduled. The figure: tokens/s of the first setting over the last.

Usage: .venv/bin/python -m bench.local_engines [--requests 32] [--settings auto,2,in-process] [--store PATH]
       [--params PATH] [--members NAME,...] [--any-engine]
Last line: one JSON object (DESIGN.md's bench format).
"""
from __future__ import annotations

import argparse
import json
import sys
from collections import Counter
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

from trinity.machine import commit, cpu_kind
from bench.common import replay, stored_requests

from trinity.config import load_settings
from trinity.pool.llama_server import SERVER_OMP_ENV
from trinity.pool.runtime import build_pool


def throughput(r) -> dict:
    return {"threads_per_server": r.threads, "wall_s": round(r.wall_s, 1), "completion_tokens": r.completion_tokens,
            "completion_tok_per_s": round(r.completion_tokens / r.wall_s, 2), "failed": len(r.failed)}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--requests", type=int, default=32)
    ap.add_argument("--settings", default="auto,2,in-process")
    ap.add_argument("--store", type=Path, default=ROOT / "data" / "store" / "trinity.duckdb")
    ap.add_argument("--params", type=Path, default=ROOT / "params.yaml")
    ap.add_argument("--members", default="", help="only these members' requests (comma-separated names; '' = every "
                    "member): e.g. one model working alone, as in the evaluation's tail")
    ap.add_argument("--any-engine", action="store_true",
                    help="also requests the store got from another engine (e.g. a store of the in-process engine)")
    args = ap.parse_args()

    settings = load_settings(args.params)
    members = {m for m in args.members.split(",") if m}
    unknown = members - {m.name for m in settings.pool.members}
    if unknown:
        print(f"--members: no member {sorted(unknown)} in {args.params}", file=sys.stderr)
        return 2
    requests = stored_requests(args.store, build_pool(settings.pool, None), args.requests, args.any_engine, members)
    if not requests:
        print(f"no stored request of this pool in {args.store}: run the pipeline first", file=sys.stderr)
        return 1
    names = [m.name for m in settings.pool.members]
    print(f"[bench] {len(requests)} stored requests {dict(Counter(names[r[0]] for r in requests))}, "
          f"concurrency {settings.pool.max_concurrency}", file=sys.stderr)
    results = {}
    for setting in args.settings.split(","):
        engine = "in-process" if setting == "in-process" else "llama-server"
        n = None if setting in ("auto", "in-process") else int(setting)
        pool_settings = settings.pool.model_copy(update={"members": [
            m.model_copy(update={"n_threads": n, "engine": engine}) if m.backend == "local" else m
            for m in settings.pool.members]})
        results[setting] = throughput(replay(pool_settings, requests, warm_up=True))
        print(f"[bench] threads {setting}: {json.dumps(results[setting])}", file=sys.stderr, flush=True)
    first, last = list(results)[0], list(results)[-1]
    print(json.dumps({
        "name": "local_engines",
        "figure": round(results[first]["completion_tok_per_s"] / results[last]["completion_tok_per_s"], 3),
        "unit": f"x aggregate completion tokens/s of {first} over {last}",
        "compared_to": f"the same {len(requests)} stored requests through each setting ({args.settings}), fresh "
                       f"servers or models each, same run",
        "detail": {"per_setting": results, "requests": len(requests), "concurrency": settings.pool.max_concurrency,
                   "servers_omp_env": SERVER_OMP_ENV, "commit": commit(), "cpu": cpu_kind()}}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
