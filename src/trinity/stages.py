"""The pipeline stages: prepare → encode → evolve → evaluate → report.

Each stage reads the previous stage's outputs under `<root>/data` and the same settings, and writes its
own outputs (the DVC outs in dvc.yaml). flows/ wraps each in a Prefect flow; tests call them directly.
The memo store (<root>/data/store/trinity.duckdb) is shared by the stages and is not a DVC output: it is a
content-addressed cache, so any rerun makes no LLM call for a stored request. A DVC experiment run in a temporary
copy of the workspace (`dvc exp run --temp`, as `make ablation` runs them, or `dvc exp run --queue` and then
`dvc queue start`) shares the workspace's store (`dvc_workspace`).
"""
from __future__ import annotations

import json
import time
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np

from trinity.config import PROJECT_ROOT, Settings


DVC_EXPERIMENT_DIRS = (".dvc", "tmp", "exps")
"""Where DVC runs an experiment outside the workspace: a temporary copy under <workspace>/.dvc/tmp/exps/ (`tmpXXXX`, or
`standalone/tmpXXXX` for `dvc exp run --temp`), removed once the experiment is committed."""


def dvc_workspace(root: Path) -> Path:
    """The workspace `root` is a checkout of: `root` itself, or, when `root` is a temporary copy DVC made to run a
    queued or `--temp` experiment (under <workspace>/.dvc/tmp/exps/), that workspace. Its store is the one the
    experiment shares: the calls and hidden states the workspace already paid for are not paid again, and an
    ablation's experiments reuse one another's (DuckDB's one writer at a time: one experiment at a time)."""
    root = Path(root)
    for ws in root.parents:
        if ws.joinpath(*DVC_EXPERIMENT_DIRS) in root.parents and (ws / ".dvc" / "config").is_file():
            return ws
    return root


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
    def store(self) -> Path: return dvc_workspace(self.root) / "data" / "store" / "trinity.duckdb"
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
SPLIT_FILES = {"train": "train.jsonl", "in_distribution": "in_distribution.jsonl", "heldout": "heldout.jsonl"}


ARTIFACTS = {"prepared": ("prepared-data", "dataset"), "checkpoint": ("coordinator", "model"),
             "eval": ("eval-results", "evaluation")}
"""W&B artifacts of the pipeline (name, type): prepared data → checkpoint → eval results (the lineage)."""


def _lineage(tracker, uses: tuple[str, ...] = (), logs: str | None = None, files: list[Path] = (),
             metadata: dict | None = None) -> None:
    """Record in the stage's W&B run which artifacts it consumed and the one it produced."""
    if tracker is None:
        return
    for key in uses:
        tracker.use_artifact(*ARTIFACTS[key])
    if logs is not None:
        tracker.log_artifact(*ARTIFACTS[logs], [p for p in files if p.exists()], metadata=metadata)


def prepare(settings: Settings, paths: Paths = Paths(), tracker=None) -> dict:
    from trinity.data.splits import build_all_splits, save_tasks

    d = settings.data
    splits = build_all_splits(d.resolved_root(), train=d.train, in_distribution=d.in_distribution,
                              heldout=d.heldout, seed=d.seed, math500_max_level=d.math500_max_level)
    paths.prepared.mkdir(parents=True, exist_ok=True)
    for split, name in SPLIT_FILES.items():
        save_tasks(paths.prepared / name, getattr(splits, split))
    summary = {split: len(getattr(splits, split)) for split in SPLIT_FILES}
    summary |= {f"{split}_sources": sorted({t.source for t in getattr(splits, split)}) for split in SPLIT_FILES}
    _write_json(paths.prepared / "summary.json", summary)
    _lineage(tracker, logs="prepared", files=[paths.prepared / n for n in (*SPLIT_FILES.values(), "summary.json")],
             metadata=summary)
    return summary


def _load_tasks(paths: Paths):
    """The prepared splits (train, in_distribution, heldout), re-checked by the contamination guard: an edited
    file that puts an evaluation item in training fails here, loudly, before any model is called."""
    from trinity.data.splits import Splits, assert_no_contamination, load_tasks

    for name in SPLIT_FILES.values():
        if not (paths.prepared / name).exists():
            raise FileNotFoundError(f"{paths.prepared / name} is missing: run the prepare stage first")
    splits = Splits(**{split: load_tasks(paths.prepared / name) for split, name in SPLIT_FILES.items()})
    assert_no_contamination(splits.train, [*splits.in_distribution, *splits.heldout])
    return splits


# ------------------------------------------------------------------------------------------ encode
def encode(settings: Settings, paths: Paths = Paths()) -> dict:
    """Hidden states of every task's opening transcript (the root of its rollout tree) → store + Parquet."""
    from trinity.coordinator.episode import StateCache
    from trinity.coordinator.roles import coordinator_text
    from trinity.store import Store, text_key

    tasks = [t for split in _load_tasks(paths) for t in split]
    encoder = make_encoder(settings)
    t0 = time.perf_counter()
    with Store(paths.store) as store:
        cache = StateCache(encoder, store)
        texts = [coordinator_text(t, ()) for t in tasks]
        H = cache.states(texts)
        paths.encoded.mkdir(parents=True, exist_ok=True)
        import pyarrow as pa
        import pyarrow.parquet as pq

        tbl = pa.table({"task_id": [t.id for t in tasks], "key": [text_key(x) for x in texts],
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
              f"hits {rec.store_hits}{_outage_note(rec)} ({rec.wall_s:.1f}s)", flush=True)

    return on_generation


def _outage_note(rec) -> str:
    """The progress line's outage count, when a generation had any: episodes left out of the fitness, replays."""
    if not (rec.outage_episodes or rec.outage_replays or rec.saved_outage_episodes):
        return ""
    return (f"; outages: {rec.outage_episodes} of {rec.episodes} episodes left out ({rec.outage_replays} replayed), "
            f"{rec.saved_outage_episodes} of the saved vector's")


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
    from trinity.coordinator.features import features_json
    from trinity.evolve.sep_cma import save_checkpoint, saved_fitness_episodes
    from trinity.pool.errors import check_pool_config
    from trinity.pool.runtime import build_pool
    from trinity.store import Store

    check_pool_config(settings.pool)
    train = _load_tasks(paths).train
    encoder = make_encoder(settings)
    paths.evolve_dir.mkdir(parents=True, exist_ok=True)
    # the resume state is this checkout's own (a queued experiment's copy does not share the workspace's)
    resume = paths.data / "store" / "evolve_state.pkl"
    resume.parent.mkdir(parents=True, exist_ok=True)
    with Store(paths.store) as store:
        pool = build_pool(settings.pool, store, _role_caps(settings))
        states = StateCache(encoder, store)
        result = _train(settings, train, pool, states, store, resume_path=resume,
                        run_id=run_id(settings, "evolve"), on_generation=_generation_logger(tracker, pool.names))
        layout = result.layout
        _reset_adapter(states, layout)
        meta = {
            "pool": [{"name": m.name, "model_id": m.model_id} for m in pool.members],
            "code_version": code_version(), "run_fingerprint": result.fingerprint,
            "encoder": encoder.encoder_id, "dim": int(states.dim), **layout.describe(),
            "svf_layer": settings.coordinator.svf_layer, "method": settings.evolve.method,
            "features": features_json(result.features),
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
                   "outage_episodes": sum(r["outage_episodes"] for r in history),
                   "n_params": layout.n_params, "svf_params": layout.n_svf}
        _write_json(paths.evolve_dir / "metrics.json", metrics)
    _lineage(tracker, uses=("prepared",), logs="checkpoint",
             files=[paths.checkpoint.with_suffix(".npy"), paths.checkpoint.with_suffix(".json")], metadata=metrics)
    return metrics


# ------------------------------------------------------------------------------------------ evaluate
LOCAL_JUDGE_NOTE = ("The judge is {name}, a small local model run by llama.cpp: a weak judge. FastChat's MT-Bench "
                    "scores are validated with GPT-4 as the judge; these scores only rank answers roughly. Point "
                    "`evaluate.judge` at a strong endpoint for scores comparable with published ones.")


def _judge_member(settings: Settings):
    """(the judge's PoolMember settings, whether it is a pool member) — None when no judge is configured."""
    judge = settings.evaluate.judge
    if judge is None:
        return None, False
    if isinstance(judge, str):  # config validation has checked it names a member
        return next(m for m in settings.pool.members if m.name == judge), True
    return judge, False


def evaluate(settings: Settings, paths: Paths = Paths(), tracker=None) -> dict:
    """Every method on the in-distribution and held-out items (trinity.evaluation); writes data/eval/results.json
    (the table with its intervals), metrics.json (numbers only, for DVC) and episodes.jsonl (every item's
    turns), as described in docs/eval_results_schema.md."""
    from trinity.code_version import code_version
    from trinity.coordinator.episode import StateCache
    from trinity.coordinator.features import checkpoint_features
    from trinity.data.splits import HELDOUT_SOURCES
    from trinity.evaluation import HELDOUT, IN_DISTRIBUTION, evaluate as run_eval, summarise
    from trinity.evolve.sep_cma import load_checkpoint
    from trinity.grading import preflight
    from trinity.grading.judge import MTBenchJudge, judge_pool, load_judge_prompts
    from trinity.pool.errors import check_pool_config
    from trinity.pool.runtime import build_pool
    from trinity.store import Store

    # Everything that can be wrong is checked before the first model call.
    check_pool_config(settings.pool)
    splits = _load_tasks(paths)
    tasks = {IN_DISTRIBUTION: splits.in_distribution, HELDOUT: splits.heldout}
    params, meta = load_checkpoint(paths.checkpoint)
    pool_names = [m.name for m in settings.pool.members]
    if [p["name"] for p in meta["pool"]] != pool_names:
        raise ValueError(f"checkpoint {paths.checkpoint}.json was trained on pool {[p['name'] for p in meta['pool']]}, "
                         f"but params pool.members is {pool_names}: rerun evolve")
    if meta.get("svf_layer") != settings.coordinator.svf_layer:
        raise ValueError(f"checkpoint {paths.checkpoint}.json was trained with coordinator.svf_layer "
                         f"{meta.get('svf_layer')!r}, params say {settings.coordinator.svf_layer!r}: rerun evolve")
    features = checkpoint_features(meta)
    if (features is None) != (settings.coordinator.feature_norm == "none"):
        raise ValueError(f"checkpoint {paths.checkpoint}.json was trained with coordinator.feature_norm "
                         f"{meta.get('features', {}).get('norm', 'none')!r}, params say "
                         f"{settings.coordinator.feature_norm!r}: rerun evolve")
    preflight([*splits.in_distribution, *splits.heldout])
    judged = any(t.grader == "judge" for ts in tasks.values() for t in ts)
    judge_settings, judge_in_pool = _judge_member(settings)
    if judged and judge_settings is None:
        raise ValueError("evaluate.judge: the prepared evaluation set has MT-Bench items but no judge is set")
    prompts = load_judge_prompts(settings.data.resolved_root()) if judged else None
    if judged and judge_settings.backend == "openai":
        check_pool_config(settings.pool.model_copy(update={"members": [judge_settings]}))
    encoder = make_encoder(settings)
    if meta["encoder"] != encoder.encoder_id:
        raise ValueError(f"checkpoint encoder {meta['encoder']!r} differs from configured {encoder.encoder_id!r}")
    ev = settings.evaluate
    with Store(paths.store) as store:
        pool = build_pool(settings.pool, store, _role_caps(settings))
        judge = None
        if judged:
            judge = MTBenchJudge(judge_pool(judge_settings, ev.judge_max_tokens, store, settings.pool.max_concurrency),
                                 prompts)
        run = run_eval(settings, params, tasks, pool, StateCache(encoder, store, features=features), _grade(),
                       judge=judge)
        judge_info = None
        if judge is not None:
            judge_info = {"name": judge_settings.name, "model_id": judge.pool.members[0].model_id,
                          "in_pool": judge_in_pool, "max_tokens": ev.judge_max_tokens, **judge.stats(),
                          "note": LOCAL_JUDGE_NOTE.format(name=judge_settings.name)
                          if judge_settings.backend == "local" else None}
        out = summarise(run, resamples=ev.bootstrap_resamples, seed=ev.seed)
        out |= {
            "judge": judge_info,
            "seeds": {"data": settings.data.seed, "evolve": settings.evolve.seed, "evaluate": ev.seed,
                      "random_routing": ev.random_routing_seed},
            "checkpoint": {k: meta.get(k) for k in ("run_fingerprint", "code_version", "method", "generations",
                                                    "params_hash")},
            "eval_code_version": code_version(),
            "pool": [{"name": m.name, "model_id": m.model_id} for m in pool.members],
            "never_trained_on": {
                "benchmarks": sorted({t.source for t in splits.heldout}),
                "items": len(splits.heldout),
                "training_sources": sorted({t.source for t in splits.train}), "training_items": len(splits.train),
                "in_distribution_items": len(splits.in_distribution),
                "check": "no held-out benchmark among the training sources, and no evaluation item (held-out or "
                         "in-distribution) in training by task id or normalised prompt text",
                "guarded_sources": sorted(HELDOUT_SOURCES)},
            "pool_calls": pool.stats.calls_made, "store_hits": pool.stats.store_hits,
            "failed_calls": pool.stats.failures, "transient_failures": pool.stats.transient_failures,
            "wall_s": round(run.wall_s, 1),
        }
    paths.eval_dir.mkdir(parents=True, exist_ok=True)
    tmp = paths.eval_dir / "episodes.jsonl.tmp"
    with open(tmp, "w") as f:
        for item in run.items:
            f.write(json.dumps(item.row(), default=str) + "\n")
    tmp.replace(paths.eval_dir / "episodes.jsonl")
    _write_json(paths.eval_dir / "results.json", out)
    metrics = _eval_metrics(out)
    _write_json(paths.eval_dir / "metrics.json", metrics)
    _raise_on_outages(run.items)  # after writing: nothing computed is lost, and the retry pays only the outages
    if tracker is not None:
        from trinity.tracking import log_eval_results

        log_eval_results(tracker, out, None)
    _lineage(tracker, uses=("prepared", "checkpoint"), logs="eval",
             files=[paths.eval_dir / n for n in ("results.json", "metrics.json", "episodes.jsonl")],
             metadata={"averages": out["averages"], "checkpoint": out["checkpoint"]})
    return metrics


def _raise_on_outages(items) -> None:
    """OutageError when items are unscored because a call failed transiently (evaluation marks them "outage: ..."):
    how many, by which members, and that a rerun asks only those calls again (every other reply is stored)."""
    from collections import Counter

    from trinity.coordinator.episode import OutageError, is_outage

    out = [it for it in items if (it.error or "").startswith("outage:")]
    if not out:
        return
    by = Counter(next((t.model for _, t in it.turns if is_outage(t)), "?") for it in out)
    methods = Counter(it.method for it in out)
    raise OutageError(
        f"evaluate: {len(out)} of {len(items)} items unscored by an outage (failed calls by member: "
        f"{', '.join(f'{m}: {k}' for m, k in sorted(by.items()))}; by method: "
        f"{', '.join(f'{m}: {k}' for m, k in sorted(methods.items()))}). The results are written with those items "
        "unscored; every other reply is in the store, so a rerun (the stage task retries) asks only the failed calls "
        "again")


def _eval_metrics(res: dict) -> dict:
    """The DVC metrics file: {method: {benchmark: score, avg_in_distribution, avg_heldout}}, numbers only."""
    out = {}
    for method, per in res["scores"].items():
        row = {b: c["score"] for b, c in per.items() if c["score"] is not None}
        row |= {f"avg_{split}": v for split, v in res["averages"].get(method, {}).items() if v is not None}
        out[method] = row
    return out


# ------------------------------------------------------------------------------------------ report
def report(settings: Settings, paths: Paths = Paths(), tracker=None) -> dict:
    """reports/summary.md, reports/plots/*.png and reports/traces.md from the run's own files (trinity.report):
    its declared dependencies only. (The store's Parquet export is `trinity export`: the store is a cache every
    run adds to, so its export is no output of this stage's dependencies.)"""
    from trinity.report import write_report

    written = write_report(paths.eval_dir, paths.evolve_dir, paths.checkpoint.with_suffix(".json"), paths.reports)
    if tracker is not None:  # the tables were logged by the evaluate stage's run; the report's run shows the plots
        for name, p in written.items():
            if p.suffix == ".png":
                tracker.image(f"plots/{name}", p)
    return {name: str(p) for name, p in written.items()}


# ------------------------------------------------------------------------------------------ dispatch
STAGES = ("prepare", "encode", "evolve", "evaluate", "report")
_TRACKED = frozenset({"prepare", "evolve", "evaluate", "report"})
"""Stages that log per-generation / per-method metrics to the tracker while they run."""


def run_stage(name: str, settings: Settings, paths: Paths = Paths(), tracker=None) -> dict:
    """Run one stage by name: the single dispatch behind every Prefect flow and `trinity stage`.
    Returns the stage's result as a JSON-able dict (the report stage: {"report": <path>})."""
    if name not in STAGES:
        raise ValueError(f"unknown stage {name!r}: expected one of {', '.join(STAGES)}")
    fn = globals()[name]
    out = fn(settings, paths, tracker=tracker) if name in _TRACKED else fn(settings, paths)
    return out if isinstance(out, dict) else {name: str(out)}

