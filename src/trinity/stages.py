"""The pipeline stages: prepare → encode → evolve → evaluate → report.

Each stage reads the previous stage's outputs under `<root>/data` and the same settings, and writes its
own outputs (the DVC outs in dvc.yaml). flows/ wraps each in a Prefect flow; tests call them directly.
The memo store (<root>/data/store/trinity.duckdb) is shared by the stages and is not a DVC output: it is a
content-addressed cache, so any rerun makes no LLM call for a stored request.
"""
from __future__ import annotations

import json
import time
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np

from trinity.config import PROJECT_ROOT, Settings


@dataclass(frozen=True)
class Paths:
    root: Path = PROJECT_ROOT

    @property
    def data(self) -> Path: return self.root / "data"
    @property
    def prepared(self) -> Path: return self.data / "prepared"
    @property
    def encoded(self) -> Path: return self.data / "encode"
    @property
    def store(self) -> Path: return self.data / "store" / "trinity.duckdb"
    @property
    def checkpoint(self) -> Path: return self.data / "checkpoints" / "coordinator"
    @property
    def evolve_dir(self) -> Path: return self.data / "evolve"
    @property
    def eval_dir(self) -> Path: return self.data / "eval"
    @property
    def exports(self) -> Path: return self.data / "exports"
    @property
    def reports(self) -> Path: return self.root / "reports"


def _write_json(path: Path, obj) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(path.suffix + ".tmp")
    tmp.write_text(json.dumps(obj, indent=2, sort_keys=True, default=str) + "\n")
    tmp.replace(path)


def make_encoder(settings: Settings):
    from trinity.coordinator.encoder import TranscriptEncoder

    return TranscriptEncoder(settings.coordinator.encoder, max_tokens=settings.coordinator.max_encode_tokens)


def _role_caps(settings: Settings) -> dict[str, int]:
    c = settings.coordinator
    return {"thinker": c.thinker_max_tokens, "verifier": c.verifier_max_tokens}


def _grade():
    from trinity.grading import grade

    return grade


# ------------------------------------------------------------------------------------------ prepare
def prepare(settings: Settings, paths: Paths = Paths()) -> dict:
    from trinity.data.splits import assert_no_contamination, build_splits, save_tasks

    d = settings.data
    train, heldout = build_splits(d.resolved_root(), train=d.train, heldout=d.heldout, seed=d.seed,
                                  math500_max_level=d.math500_max_level)
    assert_no_contamination(train, heldout)
    paths.prepared.mkdir(parents=True, exist_ok=True)
    save_tasks(paths.prepared / "train.jsonl", train)
    save_tasks(paths.prepared / "heldout.jsonl", heldout)
    summary = {"train": len(train), "heldout": len(heldout),
               "train_sources": sorted({t.source for t in train}), "heldout_sources": sorted({t.source for t in heldout})}
    _write_json(paths.prepared / "summary.json", summary)
    return summary


def _load_tasks(paths: Paths):
    from trinity.data.splits import load_tasks

    for name in ("train.jsonl", "heldout.jsonl"):
        if not (paths.prepared / name).exists():
            raise FileNotFoundError(f"{paths.prepared / name} is missing: run the prepare stage first")
    return load_tasks(paths.prepared / "train.jsonl"), load_tasks(paths.prepared / "heldout.jsonl")


# ------------------------------------------------------------------------------------------ encode
def encode(settings: Settings, paths: Paths = Paths()) -> dict:
    """Hidden states of every task's opening transcript (the root of its rollout tree) → store + Parquet."""
    from trinity.coordinator.episode import StateCache
    from trinity.coordinator.roles import coordinator_text
    from trinity.store import Store, text_key

    train, heldout = _load_tasks(paths)
    encoder = make_encoder(settings)
    t0 = time.perf_counter()
    with Store(paths.store) as store:
        cache = StateCache(encoder, store)
        texts = [coordinator_text(t, ()) for t in [*train, *heldout]]
        H = cache.states(texts)
        paths.encoded.mkdir(parents=True, exist_ok=True)
        import pyarrow as pa
        import pyarrow.parquet as pq

        tbl = pa.table({"task_id": [t.id for t in [*train, *heldout]], "key": [text_key(x) for x in texts],
                        "state": [row.tolist() for row in H]})
        pq.write_table(tbl, paths.encoded / "root_states.parquet")
    summary = {"encoder_id": encoder.encoder_id, "dim": int(encoder.dim), "transcripts": len(texts),
               "newly_encoded": cache.encoded, "wall_s": round(time.perf_counter() - t0, 3)}
    _write_json(paths.encoded / "summary.json", summary)
    return summary


# ------------------------------------------------------------------------------------------ evolve
def evolve(settings: Settings, paths: Paths = Paths(), tracker=None) -> dict:
    from trinity.coordinator.episode import StateCache
    from trinity.coordinator.head import HeadShape
    from trinity.evolve.sep_cma import evolve as run_es, save_checkpoint
    from trinity.pool.errors import check_pool_config
    from trinity.pool.runtime import build_pool
    from trinity.store import Store

    check_pool_config(settings.pool)
    train, _ = _load_tasks(paths)
    encoder = make_encoder(settings)
    paths.evolve_dir.mkdir(parents=True, exist_ok=True)
    with Store(paths.store) as store:
        pool = build_pool(settings.pool, store, _role_caps(settings))
        states = StateCache(encoder, store)

        def on_generation(rec):
            if tracker is not None:
                tracker.log({k: v for k, v in asdict(rec).items() if not isinstance(v, dict)}
                            | {f"model_usage/{k}": v for k, v in rec.model_usage.items()}
                            | {f"role_usage/{k}": v for k, v in rec.role_usage.items()}, step=rec.generation)
            print(f"[evolve] gen {rec.generation}: best {rec.best_fitness:.3f} mean {rec.mean_fitness:.3f} "
                  f"sigma {rec.sigma:.4f} calls {rec.calls_made} hits {rec.store_hits} ({rec.wall_s:.0f}s)", flush=True)

        result = run_es(settings, train, pool, states, _grade(), resume_path=paths.data / "store" / "evolve_state.pkl",
                        on_generation=on_generation, run_id=f"evolve-{settings.params_hash()[:12]}", store=store)
        shape = HeadShape(len(pool), states.dim)
        meta = {
            "pool": [{"name": m.name, "model_id": m.model_id} for m in pool.members],
            "encoder": encoder.encoder_id, "dim": int(states.dim), "head_shape": [shape.n_models + 3, shape.dim],
            "n_params": shape.n_params, "seed": settings.evolve.seed, "params_hash": settings.params_hash(),
            "params_file": settings.source_path, "generations": settings.evolve.generations,
            "best_fitness": result.best_fitness, "final_mean_fitness": result.history[-1].mean_fitness if result.history else None,
            "train_tasks": [t.id for t in train],
        }
        save_checkpoint(paths.checkpoint, result.params, meta)
        history = [asdict(r) for r in result.history]
        _write_json(paths.evolve_dir / "history.json", history)
        metrics = {"best_fitness": result.best_fitness, "generations": len(history),
                   "calls_made": pool.stats.calls_made, "store_hits": pool.stats.store_hits,
                   "n_params": shape.n_params}
        _write_json(paths.evolve_dir / "metrics.json", metrics)
    return metrics


# ------------------------------------------------------------------------------------------ evaluate
def evaluate(settings: Settings, paths: Paths = Paths(), tracker=None) -> dict:
    from trinity.coordinator.episode import StateCache
    from trinity.evaluation import evaluate as run_eval
    from trinity.evolve.sep_cma import load_checkpoint
    from trinity.pool.errors import check_pool_config
    from trinity.pool.runtime import build_pool
    from trinity.store import Store

    check_pool_config(settings.pool)
    _, heldout = _load_tasks(paths)
    params, meta = load_checkpoint(paths.checkpoint)
    pool_names = [m.name for m in settings.pool.members]
    if [p["name"] for p in meta["pool"]] != pool_names:
        raise ValueError(f"checkpoint {paths.checkpoint}.json was trained on pool {[p['name'] for p in meta['pool']]}, "
                         f"but params pool.members is {pool_names}: rerun evolve")
    encoder = make_encoder(settings)
    if meta["encoder"] != encoder.encoder_id:
        raise ValueError(f"checkpoint encoder {meta['encoder']!r} differs from configured {encoder.encoder_id!r}")
    with Store(paths.store) as store:
        pool = build_pool(settings.pool, store, _role_caps(settings))
        results = run_eval(settings, params, heldout, pool, StateCache(encoder, store), _grade())
    paths.eval_dir.mkdir(parents=True, exist_ok=True)
    with open(paths.eval_dir / "episodes.jsonl", "w") as f:
        for r in results:
            for row in r.per_task:
                f.write(json.dumps({"method": r.method, **row}, default=str) + "\n")
    table = [{k: v for k, v in asdict(r).items() if k != "per_task"} for r in results]
    out = {"heldout": sorted({t.source for t in heldout}), "n_items": len(heldout), "methods": table,
           "pool_calls": pool.stats.calls_made, "store_hits": pool.stats.store_hits}
    _write_json(paths.eval_dir / "results.json", out)
    if tracker is not None:
        tracker.table("eval", ["method", "accuracy", "n", "mean_turns", "calls", "cost_usd"],
                      [[r["method"], r["accuracy"], r["n"], r["mean_turns"], r["calls"], r["cost_usd"]] for r in table])
        tracker.summary({f"accuracy/{r['method']}": r["accuracy"] for r in table})
    return out


# ------------------------------------------------------------------------------------------ report
def report(settings: Settings, paths: Paths = Paths()) -> Path:
    from trinity.store import Store

    res = json.loads((paths.eval_dir / "results.json").read_text())
    meta = json.loads(paths.checkpoint.with_suffix(".json").read_text())
    history = json.loads((paths.evolve_dir / "history.json").read_text())
    lines = [
        "# Trinity — held-out evaluation", "",
        f"Held-out: {', '.join(res['heldout'])} ({res['n_items']} items, never used in training). "
        f"Pool: {', '.join(p['name'] for p in meta['pool'])}. Coordinator encoder: `{meta['encoder']}`, "
        f"head {meta['head_shape'][0]} x {meta['head_shape'][1]} = {meta['n_params']} parameters, "
        f"{meta['generations']} generations of sep-CMA-ES (seed {meta['seed']}).", "",
        "| method | accuracy | items | mean turns | LLM calls (new) | cost (USD) |",
        "|---|---|---|---|---|---|",
    ]
    for r in res["methods"]:
        lines.append(f"| {r['method']} | {r['accuracy']:.3f} | {r['n']} | {r['mean_turns']:.2f} | {r['calls']} | "
                     f"{r['cost_usd']:.4f} |")
    lines += ["", "`trinity` = the evolved coordinator (argmax policy); `alone:<model>` = that model as Worker for one "
              "turn; `random-routing` = uniform random model and role each turn (same episode loop, seeded).",
              "LLM calls (new) counts calls not already in the response store when this method ran.", "",
              "## Evolution", "", "| generation | best fitness | mean fitness | sigma | new LLM calls | store hits |",
              "|---|---|---|---|---|---|"]
    for h in history:
        lines.append(f"| {h['generation']} | {h['best_fitness']:.3f} | {h['mean_fitness']:.3f} | {h['sigma']:.4f} | "
                     f"{h['calls_made']} | {h['store_hits']} |")
    paths.reports.mkdir(parents=True, exist_ok=True)
    out = paths.reports / "summary.md"
    out.write_text("\n".join(lines) + "\n")
    with Store(paths.store) as store:
        store.export_parquet(paths.exports)
    return out
