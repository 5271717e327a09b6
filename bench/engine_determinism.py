"""How reproducible is a fresh run's pool? The stored requests of a run, asked again from scratch, twice.

Batched decoding is not batch-invariant: llama-server decodes the calls in flight as one batch, so a reply can
depend on which other calls shared its batch (float rounding moves a sampled token). The response store is the
replay anchor — a rerun pays no call and reproduces the run exactly — but two runs from *empty* stores can differ.
This measures by how much, on the requests a real run made:

- Requests: the first --requests successful requests of the run's store (default the pipeline's,
  data/store/trinity.duckdb, opened read-only) in the order they were made, over every member of the pool
  (params.yaml), roles worker/thinker/verifier (training and evaluation episodes; the MT-Bench judge's calls are
  left out), keeping only rows whose key is this pool's key for the request (the run was made with this engine and
  these settings). Each row holds the messages, the sampling (seed, temperature, max_tokens, output format) and
  the reply the run got.
- Replays A and B: each starts fresh servers (empty prompt caches; `--engine in-process`: fresh loaded models) and
  sends all the requests through the pool's own members at the pool's concurrency (`pool.max_concurrency` in
  flight, as a generation keeps them), then stops the servers.
- Counted: replies byte-identical between A and B (the figure), and between each replay and the run's stored reply.

What this does not show: in a run, a reply that differs changes the later turns of its episode (their prompts
contain it) and hence which requests are made at all; here every request is asked as the run asked it, so the
share of identical replies is per request, not per episode.

Usage: .venv/bin/python -m bench.engine_determinism [--requests 48] [--store PATH] [--params params.yaml]
       [--engine llama-server|in-process]
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
from bench.common import ROLES, replay, stored_requests

from trinity.config import load_settings
from trinity.pool.runtime import build_pool


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--requests", type=int, default=48)
    ap.add_argument("--store", type=Path, default=ROOT / "data" / "store" / "trinity.duckdb")
    ap.add_argument("--params", type=Path, default=ROOT / "params.yaml")
    ap.add_argument("--engine", choices=("llama-server", "in-process"), default=None,
                    help="the engine to replay with (default: the run's, params.yaml's pool.local_engine)")
    args = ap.parse_args()

    settings = load_settings(args.params)
    requests = stored_requests(args.store, build_pool(settings.pool, None), args.requests)
    if not requests:
        print(f"no stored request of this pool in {args.store}: run the pipeline first", file=sys.stderr)
        return 1
    engine = args.engine or settings.pool.local_engine
    pool_settings = settings.pool.model_copy(update={"members": [
        m.model_copy(update={"engine": engine}) for m in settings.pool.members]})
    names = [m.name for m in settings.pool.members]
    print(f"[bench] {len(requests)} stored requests ({dict(Counter(names[r[0]] for r in requests))}); "
          f"replaying twice with {engine} at concurrency {settings.pool.max_concurrency}", file=sys.stderr)
    ra = replay(pool_settings, requests)
    print(f"[bench] replay A: {ra.wall_s:.0f}s", file=sys.stderr)
    rb = replay(pool_settings, requests)
    print(f"[bench] replay B: {rb.wall_s:.0f}s", file=sys.stderr)
    a, b = ra.texts, rb.texts

    stored = [r[4] for r in requests]
    same_ab = [x == y for x, y in zip(a, b)]
    per_member = {}
    for name in dict.fromkeys(names[r[0]] for r in requests):
        ix = [j for j, r in enumerate(requests) if names[r[0]] == name]
        per_member[name] = {"requests": len(ix), "identical_a_b": sum(same_ab[j] for j in ix),
                            "identical_run_a": sum(stored[j] == a[j] for j in ix)}
    detail = {
        "engine": engine, "requests": len(requests), "concurrency": settings.pool.max_concurrency,
        "identical_a_b": sum(same_ab), "identical_run_a": sum(s == x for s, x in zip(stored, a)),
        "identical_run_b": sum(s == x for s, x in zip(stored, b)), "per_member": per_member,
        "by_role_identical_a_b": {role: f"{sum(same_ab[j] for j, r in enumerate(requests) if r[1] == role)}/"
                                        f"{sum(1 for r in requests if r[1] == role)}" for role in ROLES},
        "wall_s": [round(ra.wall_s, 1), round(rb.wall_s, 1)],
        "completion_tokens": [ra.completion_tokens, rb.completion_tokens],
        "failed": [len(ra.failed), len(rb.failed)],
        "store": str(args.store), "commit": commit(), "cpu": cpu_kind(),
    }
    print(json.dumps({"name": "engine_determinism", "figure": round(sum(same_ab) / len(requests), 3),
                      "unit": "share of replies byte-identical between two fresh replays",
                      "compared_to": "the run's own stored replies (detail.identical_run_a/b) and between the two "
                                     "replays, same requests, same run",
                      "detail": detail}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
