"""P-bench: LLM calls per evaluated episode, per generation, over a 20-generation sep-CMA-ES run.

The embedded pool (all four bundled models, as in params.yaml, with small max_tokens; --pool pair keeps only
SmolLM2-135M and Qwen2.5-Coder-0.5B) and the bundled encoder play the
pipeline's default training setup (params.yaml: MATH-500 level <= 2 and MMLU, 3 + 3 tasks, 3 tasks per
generation, pycma's default popsize, max_turns 3) for 20 generations in a fresh temporary store. Every
never-seen node of a rollout tree costs one call; everything stored is free. The figure is new calls per
episode in the last generation (goal <= 0.1); the detail holds the whole curve, the totals, and what the
same episodes would have cost without the store (one call per turn played).

Usage: .venv/bin/python -m bench.calls_per_episode [--generations 20] [--max-turns 3] [--tasks 3,3] [--pool all]
Last line: one JSON object (see the bench format in DESIGN.md).
"""
from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

from trinity.config import Settings


POOLS = {
    "pair": [("smollm2-135m", "smollm2-135m-instruct"), ("qwen-coder-0.5b", "qwen2.5-coder-0.5b-instruct")],
    "all": [("smollm2-135m", "smollm2-135m-instruct"), ("qwen-coder-0.5b", "qwen2.5-coder-0.5b-instruct"),
            ("qwen-coder-1.5b", "qwen2.5-coder-1.5b-instruct"), ("gemma3-270m", "gemma-3-270m")],
}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--generations", type=int, default=20)
    ap.add_argument("--max-turns", type=int, default=3)
    ap.add_argument("--tasks", default="3,3", help="MATH-500,MMLU training items")
    ap.add_argument("--episodes-per-candidate", type=int, default=3)
    ap.add_argument("--popsize", type=int, default=None, help="default: pycma's 4 + 3 ln n")
    ap.add_argument("--pool", choices=["all", "pair"], default="all",
                    help="all: the four bundled models (the default pool); pair: SmolLM2-135M + Qwen2.5-Coder-0.5B")
    args = ap.parse_args()

    from trinity.coordinator.policy import make_encoder
    from trinity.coordinator.episode import RolloutTrees, StateCache
    from trinity.data.splits import build_splits
    from trinity.evolve.loop import evolve
    from trinity.grading import grade
    from trinity.pool.runtime import build_pool
    from trinity.store import Store

    n_math, n_mmlu = (int(x) for x in args.tasks.split(","))
    settings = Settings.model_validate({
        "data": {"train": {"math500": n_math, "mmlu": n_mmlu}, "heldout": {"gsm8k": 1}, "math500_max_level": 2},
        "pool": {"members": [{"name": name, "backend": "local", "model": model, "max_tokens": 24}
                             for name, model in POOLS[args.pool]]},
        "coordinator": {"max_turns": args.max_turns, "thinker_max_tokens": 16, "verifier_max_tokens": 4,
                        "max_encode_tokens": 512},
        "evolve": {"generations": args.generations, "popsize": args.popsize,
                   "episodes_per_candidate": args.episodes_per_candidate},
    })
    d = settings.data
    train, _ = build_splits(d.resolved_root(), train=d.train, heldout=d.heldout, seed=d.seed,
                            math500_max_level=d.math500_max_level)
    encoder = make_encoder(settings)
    curve = []
    t0 = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="trinity-bench-calls-") as tmp, Store(Path(tmp) / "s.duckdb") as store:
        pool = build_pool(settings.pool, store)  # evolve asks each role's caps of settings (RoleSampling.of)
        states = StateCache(encoder, store)
        played = {"turns": 0}

        def on_generation(rec):
            turns = sum(rec.model_usage.values())  # picks; a Verifier-first pick makes no request
            curve.append({"generation": rec.generation, "episodes": rec.episodes, "calls": rec.calls_made,
                          "calls_per_episode": round(rec.calls_per_episode, 4), "store_hits": rec.store_hits,
                          "states_encoded": rec.states_encoded, "picks": turns, "sigma": round(rec.sigma, 5),
                          "mean_fitness": round(rec.mean_fitness, 4), "wall_s": round(rec.wall_s, 1)})
            played["turns"] += rec.calls_made + rec.store_hits
            print(f"gen {rec.generation:2d}: {rec.calls_made:4d} calls / {rec.episodes} episodes = "
                  f"{rec.calls_per_episode:.3f}  (hits {rec.store_hits}, {rec.wall_s:.0f}s)", file=sys.stderr, flush=True)

        res = evolve(settings, train, pool, states, grade, on_generation=on_generation, store=store,
                     trees=RolloutTrees())
        popsize = res.history[0].episodes // min(len(train), args.episodes_per_candidate)
        total_calls = pool.stats.calls_made
        calls_by_model = dict(pool.stats.calls_by_model)
    episodes = sum(p["episodes"] for p in curve)
    last = curve[-1]
    print(json.dumps({
        "name": "calls_per_episode", "figure": last["calls_per_episode"], "unit": "LLM calls per episode",
        "goal": "<= 0.1 (last generation)",
        "compared_to": "the same episodes without the store: one call per request played "
                       f"({played['turns'] / episodes:.2f} per episode over the run)",
        "detail": {"curve": curve, "generations": len(curve), "popsize": popsize,
                   "tasks_per_generation": min(len(train), args.episodes_per_candidate), "train_tasks": len(train),
                   "max_turns": args.max_turns, "episodes": episodes, "total_calls": total_calls,
                   "calls_by_model": calls_by_model, "requests_played": played["turns"],
                   "calls_per_episode_overall": round(total_calls / episodes, 4),
                   "pool": [m.model for m in settings.pool.members], "max_tokens": 24, "thinker_max_tokens": 16,
                   "verifier_max_tokens": 4, "wall_s": round(time.perf_counter() - t0, 1)},
    }))


if __name__ == "__main__":
    main()
