"""The training bill at the paper's shape, measured: sep-CMA-ES generations of popsize 33 x 16 tasks on the
embedded pool (params.yaml's pool, encoder, reward), from an empty store.

Per generation: new LLM calls, store hits and hit rate, wall time, and where the time went — pool calls
(wall time of the turns' `complete_many` batches), encoder forwards, grading (the code sandbox included) and
the rest (head products, pycma, bookkeeping). Projected wall time of 60 generations: the measured generations
plus, for every further one, the last measured generation's wall time — an upper bound as long as new calls
per generation do not grow (they fall as the rollout trees fill; the figure says how far they had fallen).

Training tasks: a seeded draw from the training benchmarks (params.yaml data.train's sources, `--per-source`
items each, MATH-500 levels <= data.math500_max_level) — never the evaluation items (the prepare stage's
guard is applied). Nothing is read from or written to the project's store: the store is a temporary one
(or `--store PATH`, kept, so a later run continues from it: then it is no longer "from empty").

Usage: .venv/bin/python -m bench.training_cost [--generations 2] [--popsize 33] [--tasks-per-generation 16]
       [--per-source 8] [--store PATH]
Last line: one JSON object (DESIGN.md's bench format). Slow: about an hour per generation from an empty store on
2 cores (that is what it measures); progress goes to stderr.
"""
from __future__ import annotations

import argparse
import asyncio
import json
import signal
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

from trinity.machine import commit, cpu_kind


def _interrupt(signum, frame):
    raise KeyboardInterrupt


class _Timed:
    """Wall time spent inside a callable (sync or async), accumulated."""

    def __init__(self):
        self.seconds = 0.0

    def wrap(self, fn):
        if asyncio.iscoroutinefunction(fn):
            async def timed_async(*a, **k):
                t = time.perf_counter()
                try:
                    return await fn(*a, **k)
                finally:
                    self.seconds += time.perf_counter() - t
            return timed_async

        def timed(*a, **k):
            t = time.perf_counter()
            try:
                return fn(*a, **k)
            finally:
                self.seconds += time.perf_counter() - t
        return timed


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--generations", type=int, default=2)
    ap.add_argument("--popsize", type=int, default=33)
    ap.add_argument("--tasks-per-generation", type=int, default=16)
    ap.add_argument("--per-source", type=int, default=8, help="training items per training benchmark")
    ap.add_argument("--sigma0", type=float, default=None, help="default: the paper's (the settings' default, 0.03)")
    ap.add_argument("--project-generations", type=int, default=60)
    ap.add_argument("--params", type=Path, default=ROOT / "params.yaml")
    ap.add_argument("--store", type=Path, default=None, help="keep the store here (default: a temporary one)")
    a = ap.parse_args(argv)

    from trinity.config import load_settings
    from trinity.coordinator.episode import StateCache
    from trinity.data.splits import splits_from_settings
    from trinity.evolve.loop import evolve, saved_fitness_episodes
    from trinity.grading import grade, preflight
    from trinity.pool.runtime import build_pool
    from trinity.pool.llama_server import with_thread_budget
    from trinity.coordinator.policy import make_encoder
    from trinity.store import Store

    base = load_settings(a.params)
    dump = base.model_dump(exclude={"source_path"})
    from trinity.config import EvolveSettings
    dump["evolve"].update(method="sep_cma", popsize=a.popsize, episodes_per_candidate=a.tasks_per_generation,
                          generations=a.generations,
                          sigma0=a.sigma0 if a.sigma0 is not None else EvolveSettings.model_fields["sigma0"].default)
    from trinity.config import Settings
    settings = Settings.model_validate(dump)
    d = settings.data
    splits = splits_from_settings(d, train={k: a.per_source for k in d.train})
    train = splits.train
    preflight(train)
    encoder = make_encoder(settings)
    pool_s, encode_s, grade_s = _Timed(), _Timed(), _Timed()
    encoder.encode = encode_s.wrap(encoder.encode)
    timed_grade = grade_s.wrap(grade)
    gens = []
    t_start = time.perf_counter()
    with tempfile.TemporaryDirectory() as tmp:
        store_path = a.store or Path(tmp) / "store.duckdb"
        fresh = not store_path.exists()
        with Store(store_path) as store:
            pool = build_pool(settings.pool, store)  # the training loop asks each role's caps of settings
            pool.complete_many = pool_s.wrap(pool.complete_many)
            states = StateCache(encoder, store)
            marks = {"pool": 0.0, "encode": 0.0, "grade": 0.0}

            def on_generation(rec):
                spent = {"pool": pool_s.seconds, "encode": encode_s.seconds, "grade": grade_s.seconds}
                part = {k: round(spent[k] - marks[k], 1) for k in spent}
                marks.update(spent)
                lookups = rec.calls_made + rec.store_hits
                g = {"generation": rec.generation, "new_calls": rec.calls_made, "store_hits": rec.store_hits,
                     "store_hit_rate": round(rec.store_hits / lookups, 4) if lookups else 1.0,
                     "episodes": rec.episodes, "states_encoded": rec.states_encoded, "wall_s": round(rec.wall_s, 1),
                     "seconds_in": {"pool_calls": part["pool"], "encoder": part["encode"], "grading": part["grade"],
                                    "other": round(rec.wall_s - sum(part.values()), 1)},
                     "mean_fitness": round(rec.mean_fitness, 4), "saved_fitness": round(rec.saved_fitness, 4)}
                gens.append(g)
                print(f"[training_cost] gen {rec.generation}: {rec.calls_made} new calls, {rec.store_hits} hits "
                      f"({g['store_hit_rate']:.0%}), {rec.wall_s / 60:.1f} min — pool {part['pool'] / 60:.1f} min, "
                      f"encoder {part['encode'] / 60:.1f}, grading {part['grade'] / 60:.1f}", file=sys.stderr,
                      flush=True)

            # Stopped early (Ctrl-C, SIGTERM): what was paid stays in the store; the JSON line still reports the
            # generations completed and the calls of the unfinished one.
            signal.signal(signal.SIGTERM, _interrupt)
            interrupted = None
            t_evolve = time.perf_counter()
            try:
                evolve(settings, train, pool, states, timed_grade, on_generation=on_generation, store=None)
            except KeyboardInterrupt:
                done = sum(g["new_calls"] for g in gens)
                interrupted = {"generation": len(gens), "new_calls": pool.stats.calls_made - done,
                               "wall_s": round(time.perf_counter() - t_evolve - sum(g["wall_s"] for g in gens), 1),
                               "seconds_in_pool_calls": round(pool_s.seconds - marks["pool"], 1)}
                print(f"[training_cost] interrupted in generation {len(gens)}: {interrupted}", file=sys.stderr)
    measured = sum(g["wall_s"] for g in gens)
    rest = max(a.project_generations - len(gens), 0)
    projected_h = (measured + rest * gens[-1]["wall_s"]) / 3600 if gens else None
    totals = {k: round(sum(g["seconds_in"][k] for g in gens), 1) for k in ("pool_calls", "encoder", "grading", "other")}
    dominant = max(totals, key=totals.get) if gens else None
    print(json.dumps({
        "name": "training_cost", "figure": round(projected_h, 2) if projected_h is not None else None,
        "unit": f"projected hours for {a.project_generations} generations (measured + last generation's wall time "
                "for each further one)",
        "goal": "<= 8",
        "compared_to": f"{len(gens)} measured generations of the same run (popsize {a.popsize} x "
                       f"{a.tasks_per_generation} tasks, {'an empty' if fresh else 'a pre-filled'} store)",
        "detail": {"generations": gens, "seconds_in_total": totals, "dominated_by": dominant,
                   "train_tasks": len(train), "train_sources": {k: a.per_source for k in d.train},
                   "pool": [m.name for m in settings.pool.members], "encoder": encoder.encoder_id,
                   "local_engine": settings.pool.local_engine, "max_concurrency": settings.pool.max_concurrency,
                   "threads_per_member": {m.name: m.n_threads for m in with_thread_budget(settings.pool).members
                                          if m.backend == "local"},
                   "saved_fitness_episodes": len(saved_fitness_episodes(settings, train)),
                   "interrupted_generation": interrupted,
                   "wall_s": round(time.perf_counter() - t_start, 1), "commit": commit(), "cpu": cpu_kind()}}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
