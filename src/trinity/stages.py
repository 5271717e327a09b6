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
    @property
    def ablation_dir(self) -> Path: return self.data / "ablation"


def _write_json(path: Path, obj) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(path.suffix + ".tmp")
    tmp.write_text(json.dumps(obj, indent=2, sort_keys=True, default=str) + "\n")
    tmp.replace(path)


def run_id(settings: Settings, stage: str) -> str:
    """A run's id in the store's episodes table and in W&B: the stage, the settings and the code version
    (`trinity.code_version`), so runs of different code never share an id."""
    from trinity.code_version import code_version

    return f"{stage}-{settings.params_hash()[:12]}-{code_version()[:8]}"


def make_encoder(settings: Settings):
    from trinity.coordinator.encoder import TranscriptEncoder

    c = settings.coordinator
    return TranscriptEncoder(c.encoder, max_tokens=c.max_encode_tokens, svf_layer=c.svf_layer, dtype=c.encoder_dtype,
                             chunk_tokens=c.encode_chunk_tokens)


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
def _generation_logger(tracker, pool_names: list[str], prefix: str = "", step: bool = True):
    """W&B per generation: fitness (best/mean), step size, accuracy, model and role usage (every member and
    role, zeros included, so the curves have no gaps), model-choice entropy, new calls, store hits (and the
    hit rate), calls per episode, states encoded, cost; running totals of calls and cost."""
    totals = {"calls": 0, "cost_usd": 0.0}

    def on_generation(rec) -> None:
        totals["calls"] += rec.calls_made
        totals["cost_usd"] += rec.cost_usd
        metrics = {k: v for k, v in asdict(rec).items() if isinstance(v, (int, float)) and not isinstance(v, bool)}
        metrics |= {f"model_usage/{k}": rec.model_usage.get(k, 0) for k in pool_names}
        metrics |= {f"role_usage/{k}": v for k, v in rec.role_usage.items()}
        lookups = rec.calls_made + rec.store_hits
        metrics |= {"store_hit_rate": rec.store_hits / lookups if lookups else 1.0,
                    "calls_total": totals["calls"], "cost_usd_total": totals["cost_usd"]}
        if tracker is not None:
            tracker.log({f"{prefix}{k}": v for k, v in metrics.items()}, step=rec.generation if step else None)
        print(f"[{'ablation' if prefix else 'evolve'}:{rec.method}] gen {rec.generation}: saved vector "
              f"{rec.saved_fitness:.3f} (acc {rec.saved_accuracy:.2f}); candidates mean {rec.mean_fitness:.3f} "
              f"best {rec.best_candidate_fitness:.3f}; step {rec.sigma:.4g} calls {rec.calls_made} "
              f"hits {rec.store_hits} ({rec.wall_s:.1f}s)", flush=True)

    return on_generation


def _train(settings: Settings, train, pool, states, store, *, resume_path: Path, run_id: str, on_generation,
           trees=None):
    """The training loop of `settings.evolve.method`, its never-seen nodes expanded on the configured engine."""
    from trinity.evolve.engine import run_expanding
    from trinity.evolve.sep_cma import evolve as run_es

    return run_expanding(
        lambda: run_es(settings, train, pool, states, _grade(), resume_path=resume_path, on_generation=on_generation,
                       run_id=run_id, store=store, trees=trees),
        settings, pool, name=f"trinity-expand-{settings.evolve.method.replace('_', '-')}")


def _reset_adapter(states, layout) -> None:
    """Back to δ = 0 (the base encoder id) after SVF training evaluated its candidates' adapters."""
    if layout is not None and layout.n_svf:
        states.set_adapter(np.zeros(layout.n_svf, dtype=np.float32))


def evolve(settings: Settings, paths: Paths = Paths(), tracker=None) -> dict:
    from trinity.code_version import code_version
    from trinity.coordinator.episode import StateCache
    from trinity.evolve.sep_cma import save_checkpoint, saved_fitness_episodes
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
        result = _train(settings, train, pool, states, store, resume_path=paths.data / "store" / "evolve_state.pkl",
                        run_id=run_id(settings, "evolve"), on_generation=_generation_logger(tracker, pool.names))
        layout = result.layout
        _reset_adapter(states, layout)
        meta = {
            "pool": [{"name": m.name, "model_id": m.model_id} for m in pool.members],
            "code_version": code_version(), "run_fingerprint": result.fingerprint,
            "encoder": encoder.encoder_id, "dim": int(states.dim), **layout.describe(),
            "svf_layer": settings.coordinator.svf_layer, "method": settings.evolve.method,
            "seed": settings.evolve.seed, "params_hash": settings.params_hash(),
            "params_file": settings.source_path, "generations": settings.evolve.generations,
            "saved_fitness": result.saved_fitness,
            "saved_accuracy": result.history[-1].saved_accuracy if result.history else None,
            "saved_fitness_episodes": len(saved_fitness_episodes(settings, train)),
            "best_candidate_fitness": result.best_candidate_fitness,
            "final_mean_fitness": result.history[-1].mean_fitness if result.history else None,
            "train_tasks": [t.id for t in train],
        }
        save_checkpoint(paths.checkpoint, result.params, meta)
        history = [asdict(r) for r in result.history]
        _write_json(paths.evolve_dir / "history.json", history)
        metrics = {"saved_fitness": result.saved_fitness, "best_candidate_fitness": result.best_candidate_fitness,
                   "generations": len(history), "resumed_from_generation": result.resumed_from,
                   "code_version": code_version(), "calls_made": pool.stats.calls_made,
                   "store_hits": pool.stats.store_hits, "failed_calls": pool.stats.failures,
                   "transient_failures": pool.stats.transient_failures,
                   "n_params": layout.n_params, "svf_params": layout.n_svf}
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
    if meta.get("svf_layer") != settings.coordinator.svf_layer:
        raise ValueError(f"checkpoint {paths.checkpoint}.json was trained with coordinator.svf_layer "
                         f"{meta.get('svf_layer')!r}, params say {settings.coordinator.svf_layer!r}: rerun evolve")
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
_METHOD_NAMES = {"sep_cma": "sep-CMA-ES", "reinforce": "REINFORCE", "random_search": "random search"}


def _param_sentence(meta: dict) -> str:
    rows, d = meta["head_shape"]
    head = f"head {rows} x {d} = {rows * d} parameters"
    n_svf = meta.get("svf_params") or 0
    if not n_svf:
        return head
    return (f"{head} + {n_svf} SVF scales of encoder block {meta.get('svf_layer')} (one per singular value of "
            f"each of its linear layers) = {meta['n_params']} parameters")


PAPER_TRAINING_EPISODES = 60 * 33 * 16
"""The paper's training budget: 60 generations x ~33 candidates x 16 episodes (~31.7k episodes)."""


def _reading(res: dict, meta: dict, history: list[dict], paths: Paths) -> list[str]:
    """Plain-language reading of this run's table, computed from its own results (no fixed verdict)."""
    by = {r["method"]: r for r in res["methods"]}
    me = by.get("trinity")
    singles = [r for r in res["methods"] if r["method"].startswith("alone:")]
    if me is None or not singles:
        return []
    best = max(singles, key=lambda r: r["accuracy"])
    rnd = by.get("random-routing")
    if me["accuracy"] > best["accuracy"]:
        verdict = "beat its best single member"
    elif me["accuracy"] == best["accuracy"]:
        verdict = "tied its best single member"
    else:
        verdict = "did **not** beat its best single member"
    out = [f"**Reading it.** The evolved coordinator scored {me['accuracy']:.3f} against {best['accuracy']:.3f} for the "
           f"best member alone (`{best['method']}`)" + (f" and {rnd['accuracy']:.3f} for random routing" if rnd else "")
           + f": on these {res['n_items']} items it {verdict}."]
    picks_m, picks_r, turns = {}, {}, 0
    names = [p["name"] for p in meta["pool"]]
    ep_file = paths.eval_dir / "episodes.jsonl"
    if ep_file.exists():
        for line in ep_file.read_text().splitlines():
            e = json.loads(line)
            if e.get("method") != "trinity":
                continue
            for m, r in e.get("path", []):
                name = names[int(m)] if str(m).isdigit() and int(m) < len(names) else str(m)
                picks_m[name] = picks_m.get(name, 0) + 1
                picks_r[r] = picks_r.get(r, 0) + 1
                turns += 1
    if turns:
        fmt = lambda d: ", ".join(f"{k} {v}" for k, v in sorted(d.items(), key=lambda kv: -kv[1]))  # noqa: E731
        out.append(f"Its {turns} held-out turns went to: {fmt(picks_m)}; roles: {fmt(picks_r)}.")
    episodes = sum(int(h.get("episodes") or 0) for h in history)
    if episodes:
        out.append(f"Training played {episodes:,} episodes ({len(history)} generations); the paper trains on about "
                   f"{PAPER_TRAINING_EPISODES:,} (60 generations x ~33 candidates x 16 tasks). To train further, raise "
                   f"`evolve.generations` (a finished run carries on from its last generation) and "
                   f"`evolve.episodes_per_candidate` / `data.train`.")
    return out


def report(settings: Settings, paths: Paths = Paths()) -> Path:
    from trinity.store import Store

    res = json.loads((paths.eval_dir / "results.json").read_text())
    meta = json.loads(paths.checkpoint.with_suffix(".json").read_text())
    history = json.loads((paths.evolve_dir / "history.json").read_text())
    lines = [
        "# Trinity — held-out evaluation", "",
        f"Held-out: {', '.join(res['heldout'])} ({res['n_items']} items, never used in training). "
        f"Pool: {', '.join(p['name'] for p in meta['pool'])}. Coordinator encoder: `{meta['encoder']}`, "
        f"{_param_sentence(meta)}, {meta['generations']} generations of "
        f"{_METHOD_NAMES.get(meta.get('method', 'sep_cma'), meta.get('method'))} (seed {meta['seed']}).", "",
        "| method | accuracy | items | mean turns | LLM calls (new) | cost (USD) |",
        "|---|---|---|---|---|---|",
    ]
    for r in res["methods"]:
        lines.append(f"| {r['method']} | {r['accuracy']:.3f} | {r['n']} | {r['mean_turns']:.2f} | {r['calls']} | "
                     f"{r['cost_usd']:.4f} |")
    for paragraph in _reading(res, meta, history, paths):
        lines += ["", paragraph]
    lines += ["", "`trinity` = the evolved coordinator (argmax policy); `alone:<model>` = that model as Worker for one "
              "turn; `random-routing` = uniform random model and role each turn (same episode loop, seeded).",
              "LLM calls (new) counts calls not already in the response store when this method ran.", "",
              "## Evolution", "",
              f"Saved vector = the parameters the run saves after that generation (CMA-ES: the distribution mean), "
              f"scored on the same {meta.get('saved_fitness_episodes', '?')} sampled training episodes every "
              f"generation. Candidates = that generation's sampled population on its minibatch; their best is a "
              f"noisy maximum, not the saved vector's score.", "",
              "| generation | saved vector fitness | saved vector accuracy | candidates mean | best candidate | "
              "sigma | new LLM calls | store hits |",
              "|---|---|---|---|---|---|---|---|"]
    for h in history:
        lines.append(f"| {h['generation']} | {h['saved_fitness']:.3f} | {h['saved_accuracy']:.3f} | "
                     f"{h['mean_fitness']:.3f} | {h['best_candidate_fitness']:.3f} | {h['sigma']:.4f} | "
                     f"{h['calls_made']} | {h['store_hits']} |")
    paths.reports.mkdir(parents=True, exist_ok=True)
    out = paths.reports / "summary.md"
    out.write_text("\n".join(lines) + "\n")
    with Store(paths.store, read_only=True) as store:  # a reader: works while another process writes the store
        store.export_parquet(paths.exports)
    return out


# ------------------------------------------------------------------------------------------ ablation
ABLATION_METHODS = ("sep_cma", "reinforce", "random_search")
FINAL_FITNESS_SAMPLES = 4
"""Seeded sampled episodes per training task when scoring each method's final parameters."""


def ablation(settings: Settings, paths: Paths = Paths(), tracker=None) -> dict:
    """The paper's optimiser ablation on our pool: sep-CMA-ES vs REINFORCE vs random search, each trained with
    `evolve.*` (same tasks, minibatches, episode seeds and episode budget), then scored the same way:

    - final fitness: mean shaped reward of the final parameters over every training task,
      FINAL_FITNESS_SAMPLES seeded sampled episodes each (the training policy);
    - held-out accuracy: argmax policy on the held-out tasks (as the evaluate stage scores `trinity`);
    - model-choice entropy: entropy (nats) of the model picks over all held-out turns (0 = one model only).

    The methods share the store and the memoised trees, so whatever one method paid for, the others reuse.
    Writes data/ablation/results.json and reports/ablation.md.
    """
    import asyncio

    from trinity.coordinator.episode import (Episode, RolloutTrees, StateCache, entropy_of_counts, episode_rng,
                                             play_episodes)
    from trinity.evolve.sep_cma import param_layout
    from trinity.pool.errors import check_pool_config
    from trinity.pool.runtime import build_pool
    from trinity.store import Store

    check_pool_config(settings.pool)
    train, heldout = _load_tasks(paths)
    encoder = make_encoder(settings)
    grade = _grade()
    ev, co = settings.evolve, settings.coordinator
    rows = []
    t_all = time.perf_counter()
    with Store(paths.store) as store:
        pool = build_pool(settings.pool, store, _role_caps(settings))
        states = StateCache(encoder, store)
        trees = RolloutTrees()
        layout = param_layout(settings, len(pool), states)

        def play(eps, delta, W):
            asyncio.run(play_episodes(eps, [W], pool, states, co.max_turns, settings.reward, grade,
                                      adapters=None if delta is None else [delta], trees=trees))

        for method in ABLATION_METHODS:
            s = settings.model_copy(update={"evolve": ev.model_copy(update={"method": method})})
            row: dict = {"method": method}
            if method == "reinforce" and layout.n_svf:
                row["skipped"] = "REINFORCE trains the head only; coordinator.svf_layer is set"
                rows.append(row)
                continue
            t0, calls0 = time.perf_counter(), pool.stats.calls_made
            result = _train(s, train, pool, states, store,
                            resume_path=paths.data / "store" / f"ablation_{method}_state.pkl",
                            run_id=run_id(s, f"ablation-{method}"),
                            on_generation=_generation_logger(tracker, pool.names, prefix=f"{method}/", step=False),
                            trees=trees)
            train_calls = pool.stats.calls_made - calls0
            delta, W = layout.split(result.params)
            calls1 = pool.stats.calls_made
            fin = [Episode(task=t, candidate=0, rng=episode_rng(ev.seed, "ablation-final", k, t.id))
                   for k in range(FINAL_FITNESS_SAMPLES) for t in train]
            play(fin, delta, W)
            held = [Episode(task=t, candidate=0, rng=None) for t in heldout]
            play(held, delta, W)
            usage = dict.fromkeys(pool.names, 0)
            for e in held:
                for m, _ in e.picks:
                    usage[pool.names[m]] += 1
            h = result.history
            row.update({
                "final_fitness": float(np.mean([e.reward for e in fin])),
                "final_train_accuracy": float(np.mean([e.correct for e in fin])),
                "heldout_accuracy": float(np.mean([e.correct for e in held])) if held else 0.0,
                "heldout_model_entropy": entropy_of_counts(list(usage.values())),
                "heldout_model_usage": usage,
                "heldout_mean_turns": float(np.mean([len(e.turns) for e in held])) if held else 0.0,
                "train_episodes": int(sum(r.episodes for r in h)),
                "train_calls": train_calls, "eval_calls": pool.stats.calls_made - calls1,
                "best_candidate_fitness": result.best_candidate_fitness,
                "saved_fitness": result.saved_fitness,
                "last_mean_fitness": h[-1].mean_fitness if h else None,
                "last_model_entropy": h[-1].model_entropy if h else None,
                "curve": [{"generation": r.generation, "saved": r.saved_fitness, "best": r.best_candidate_fitness,
                           "mean": r.mean_fitness, "step": r.sigma, "calls": r.calls_made} for r in h],
                "wall_s": round(time.perf_counter() - t0, 2),
            })
            rows.append(row)
        _reset_adapter(states, layout)
    popsize = ev.popsize
    if popsize is None:
        from trinity.evolve.sep_cma import default_popsize

        popsize = default_popsize(layout.n_params)
    out = {
        "methods": rows, "train_tasks": len(train), "heldout": sorted({t.source for t in heldout}),
        "n_heldout": len(heldout), "generations": ev.generations, "popsize": popsize,
        "episodes_per_candidate": ev.episodes_per_candidate,
        "episode_budget": ev.generations * popsize * min(ev.episodes_per_candidate, len(train)),
        "final_fitness_samples": FINAL_FITNESS_SAMPLES, **layout.describe(), "seed": ev.seed,
        "encoder": encoder.encoder_id, "pool": pool.names, "wall_s": round(time.perf_counter() - t_all, 2),
    }
    _write_json(paths.ablation_dir / "results.json", out)
    _write_ablation_report(out, paths.reports / "ablation.md")
    if tracker is not None:
        done = [r for r in rows if "skipped" not in r]
        tracker.table("ablation", ["method", "final_fitness", "heldout_accuracy", "heldout_model_entropy",
                                   "train_episodes", "train_calls"],
                      [[r["method"], r["final_fitness"], r["heldout_accuracy"], r["heldout_model_entropy"],
                        r["train_episodes"], r["train_calls"]] for r in done])
    return out


def _write_ablation_report(res: dict, path: Path) -> None:
    lines = [
        "# Trinity — optimiser ablation", "",
        f"Same head ({res['head_shape'][0]} x {res['head_shape'][1]}"
        + (f" + {res['svf_params']} SVF scales" if res["svf_params"] else "") + f" = {res['n_params']} parameters), "
        f"same {res['train_tasks']} training tasks, same minibatches and episode seeds, same budget: "
        f"{res['generations']} generations x popsize {res['popsize']} x {res['episodes_per_candidate']} tasks "
        f"= {res['episode_budget']} training episodes per method. Pool: {', '.join(res['pool'])}.", "",
        "| method | final fitness | train accuracy | held-out accuracy | model-choice entropy (nats) | "
        "training episodes | new LLM calls (train / eval) |",
        "|---|---|---|---|---|---|---|",
    ]
    for r in res["methods"]:
        name = _METHOD_NAMES.get(r["method"], r["method"])
        if "skipped" in r:
            lines.append(f"| {name} | — | — | — | — | — | skipped: {r['skipped']} |")
            continue
        lines.append(f"| {name} | {r['final_fitness']:.3f} | {r['final_train_accuracy']:.3f} | "
                     f"{r['heldout_accuracy']:.3f} | {r['heldout_model_entropy']:.3f} | {r['train_episodes']} | "
                     f"{r['train_calls']} / {r['eval_calls']} |")
    lines += [
        "",
        f"Final fitness: mean shaped reward of the final parameters (CMA: the distribution mean; REINFORCE: θ; "
        f"random search: the incumbent) over every training task, {res['final_fitness_samples']} seeded sampled "
        f"episodes each. Held-out: {', '.join(res['heldout'])} ({res['n_heldout']} items), argmax policy. "
        "Model-choice entropy: of the model picks over all held-out turns. New LLM calls count only what the "
        "shared response store did not already hold when the method ran (methods run in the order listed).",
        "",
        "Paper (LiveCodeBench): REINFORCE .253 < random search .374 < sep-CMA-ES .615.",
        "",
        "## Fitness per generation (saved vector / candidates mean / best candidate)", "",
        "| generation | " + " | ".join(_METHOD_NAMES.get(r["method"], r["method"]) for r in res["methods"]) + " |",
        "|---|" + "---|" * len(res["methods"]),
    ]
    for g in range(res["generations"]):
        cells = []
        for r in res["methods"]:
            c = r.get("curve") or []
            cells.append(f"{c[g]['saved']:.3f} / {c[g]['mean']:.3f} / {c[g]['best']:.3f}" if g < len(c) else "—")
        lines.append(f"| {g} | " + " | ".join(cells) + " |")
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("\n".join(lines) + "\n")


# ------------------------------------------------------------------------------------------ dispatch
STAGES = ("prepare", "encode", "evolve", "evaluate", "report", "ablation")
_TRACKED = frozenset({"evolve", "evaluate", "ablation"})
"""Stages that log per-generation / per-method metrics to the tracker while they run."""


def run_stage(name: str, settings: Settings, paths: Paths = Paths(), tracker=None) -> dict:
    """Run one stage by name: the single dispatch behind every Prefect flow and `trinity stage`.
    Returns the stage's result as a JSON-able dict (the report stage: {"report": <path>})."""
    if name not in STAGES:
        raise ValueError(f"unknown stage {name!r}: expected one of {', '.join(STAGES)}")
    fn = globals()[name]
    out = fn(settings, paths, tracker=tracker) if name in _TRACKED else fn(settings, paths)
    return out if isinstance(out, dict) else {name: str(out)}

