"""`trinity` command line: ask a trained coordinator, run a stage, check the graders."""
from __future__ import annotations

import argparse
import asyncio
import json
import sys
from pathlib import Path

from trinity.stages import STAGES  # light: numpy + the settings schema; torch loads only when a stage runs


def _ask(args) -> int:
    from trinity import stages
    from trinity.config import load_settings
    from trinity.coordinator.episode import Episode, StateCache, play_episodes
    from trinity.coordinator.features import checkpoint_features
    from trinity.evaluation import policy_from_params
    from trinity.evolve.sep_cma import load_checkpoint
    from trinity.pool.runtime import build_pool
    from trinity.records import Task
    from trinity.store import Store

    settings = load_settings(args.params)
    paths = stages.Paths(Path(args.root).resolve())
    params, meta = load_checkpoint(paths.checkpoint)
    task = Task(id="cli/ask", source="cli", prompt=(args.question,), grader=args.grader)
    encoder = stages.make_encoder(settings)
    with Store.open_or_read(paths.store) as store:  # works while a pipeline writes the store
        pool = build_pool(settings.pool, store, stages._role_caps(settings))
        if [p["name"] for p in meta["pool"]] != pool.names:
            print(f"checkpoint pool {[p['name'] for p in meta['pool']]} != params pool {pool.names}", file=sys.stderr)
            return 2
        states = StateCache(encoder, store, features=checkpoint_features(meta))
        delta, W = policy_from_params(settings, params, len(pool), states)
        ep = Episode(task=task, candidate=0, rng=None)
        asyncio.run(play_episodes([ep], [W], pool, states, settings.coordinator.max_turns, settings.reward,
                                  lambda t, a: 0.0, adapters=None if delta is None else [delta]))
    for i, t in enumerate(ep.turns):
        print(f"--- turn {i + 1}: {t.role.value} ({t.model})\n{t.text}\n", file=sys.stderr)
    if ep.verifier_first:
        print("(the coordinator picked the Verifier before any answer: no answer)", file=sys.stderr)
    if ep.answer is None:
        print("(no Worker succeeded: no answer)", file=sys.stderr)
        return 1
    print(ep.answer)
    return 0


def _stage(args) -> int:
    from trinity import stages
    from trinity.config import load_settings

    settings = load_settings(args.params)
    out = stages.run_stage(args.name, settings, stages.Paths(Path(args.root).resolve()))
    print(json.dumps(out, default=str))
    return 0


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="trinity", description=__doc__)
    sub = ap.add_subparsers(dest="cmd", required=True)
    a = sub.add_parser("ask", help="answer a question with the trained coordinator over the pool")
    a.add_argument("question")
    a.add_argument("--grader", default="math", choices=["math", "choice", "code", "judge"],
                   help="answer format the Worker is asked for")
    a.add_argument("--params", default="params.yaml")
    a.add_argument("--root", default=".", help="project directory holding data/")
    s = sub.add_parser("stage", help="run one pipeline stage without W&B (and without Prefect, unless "
                                      "evolve.task_runner is 'dask')")
    s.add_argument("name", choices=STAGES)
    s.add_argument("--params", default="params.yaml")
    s.add_argument("--root", default=".")
    for p in (a, s):
        p.add_argument("--retry-failures", action="store_true",
                       help="ask again every request whose stored answer is a failure (outages are always asked "
                            "again; this also re-asks deterministic failures). Same as TRINITY_RETRY_FAILURES=1")
    c = sub.add_parser("check-graders", help="canonical solutions through the graders; one JSON line per benchmark")
    c.add_argument("rest", nargs=argparse.REMAINDER)
    args = ap.parse_args(argv)
    if getattr(args, "retry_failures", False):
        import os

        os.environ["TRINITY_RETRY_FAILURES"] = "1"  # read by every Store this process opens
    if args.cmd == "ask":
        return _ask(args)
    if args.cmd == "stage":
        return _stage(args)
    if args.cmd == "check-graders":
        from trinity.grading.check import main as check_main

        return check_main(args.rest)
    return 2


if __name__ == "__main__":
    sys.exit(main())
