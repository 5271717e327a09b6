"""evaluate: every method (the coordinator, the learned router, each member, random routing) on the in-distribution
and held-out items (params `evaluate`, `pool`, `coordinator`, `reward`); writes data/eval/results.json,
episodes.jsonl and reports/metrics/evaluate.json."""
from __future__ import annotations

import json
import sys

from trinity.config import Settings
from trinity.files import atomic_open, write_json
from trinity.stages.lineage import lineage
from trinity.grading import grade
from trinity.coordinator import policy
from trinity.stages.common import load_tasks
from trinity.stages.paths import Paths


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


def run(settings: Settings, paths: Paths = Paths(), tracker=None) -> dict:
    """Every method on the in-distribution and held-out items (trinity.evaluation.run); writes data/eval/results.json
    (the table with its intervals), reports/metrics/evaluate.json (numbers only, for DVC) and episodes.jsonl (every item's
    turns), as described in docs/eval_results_schema.md."""
    from trinity.code_version import code_version
    from trinity.data.splits import HELDOUT_SOURCES
    from trinity.evaluation.results import EvalResults
    from trinity.evaluation.run import evaluate as run_eval, evaluation_splits
    from trinity.evaluation.summary import summarise
    from trinity.grading import preflight
    from trinity.grading.judge import MTBenchJudge, judge_pool, load_judge_prompts
    from trinity.pool.members import check_pool_config
    from trinity.pool.runtime import build_pool
    from trinity.pool.task_runner import executor_for, run_expanding
    from trinity.store import Store

    # Everything that can be wrong is checked before the first model call.
    check_pool_config(settings.pool)
    splits = load_tasks(paths)
    tasks = evaluation_splits(splits.in_distribution, splits.heldout)
    trained = policy.Policy.load(paths.checkpoint)
    trained.check(settings)
    from trinity.coordinator.router import router_settings

    router = None
    if paths.router_checkpoint.with_suffix(".npy").exists():  # the router stage's (a dependency under DVC)
        router = policy.Policy.load(paths.router_checkpoint)
        router.check(router_settings(settings))
    else:
        print(f"[evaluate] no learned router at {paths.router_checkpoint}.npy (the router stage): its row is left out",
              file=sys.stderr, flush=True)
    preflight([*splits.in_distribution, *splits.heldout])
    judged = any(t.grader == "judge" for ts in tasks.values() for t in ts)
    judge_settings, judge_in_pool = _judge_member(settings)
    if judged and judge_settings is None:
        raise ValueError("evaluate.judge: the prepared evaluation set has MT-Bench items but no judge is set")
    prompts = load_judge_prompts(settings.data.resolved_root()) if judged else None
    if judged and judge_settings.backend == "openai":
        check_pool_config(settings.pool.model_copy(update={"members": [judge_settings]}))
    encoder = policy.make_encoder(settings)
    trained.check(settings, encoder)
    if router is not None:
        router.check(router_settings(settings), encoder)
    ev = settings.evaluate
    with Store(paths.store) as store:
        pool = build_pool(settings.pool, store, executor=executor_for(settings.pool))
        judge = None
        if judged:
            if judge_in_pool:  # the pool's own member, with its share of the cores: one server for both
                judge_settings = next(m for m in pool.settings if m.name == judge_settings.name)
            judge = MTBenchJudge(judge_pool(judge_settings, ev.judge_max_tokens, store, settings.pool.max_concurrency),
                                 prompts)
        run = run_expanding(lambda: run_eval(
            settings, trained.params, tasks, pool, trained.states(encoder, store), grade, judge=judge,
            router=None if router is None else (router.params, router.states(encoder, store))),
            settings.pool, pool, name="trinity-expand-evaluate")
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
            "checkpoint": {k: getattr(trained.meta, k) for k in ("run_fingerprint", "code_version", "method",
                                                            "generations", "params_hash")},
            "router_checkpoint": None if router is None else {
                k: getattr(router.meta, k) for k in ("run_fingerprint", "code_version", "method", "generations",
                                                "params_hash", "saved_fitness")},
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
    with atomic_open(paths.eval_dir / "episodes.jsonl") as f:
        for item in run.items:
            f.write(json.dumps(item.row(), default=str) + "\n")
    results = EvalResults.from_dict(out)  # checked against docs/eval_results_schema.md before it is written
    results.write(paths.eval_dir / "results.json")
    metrics = results.dvc_metrics()
    write_json(paths.metrics("evaluate"), metrics)
    _raise_on_outages(run.items)  # after writing: nothing computed is lost, and the retry pays only the outages
    if tracker is not None:
        tracker.log_eval_results(results)
    used = ("prepared", "checkpoint", *(("router-checkpoint",) if router is not None else ()))
    lineage(tracker, paths, uses=used, logs="eval",
            metadata={"averages": out["averages"], "checkpoint": out["checkpoint"]})
    return metrics


def _raise_on_outages(items) -> None:
    """OutageError when items are unscored because a call failed transiently (`ItemResult.unscored_by_outage`):
    how many, by which members, and that a rerun asks only those calls again (every other reply is stored)."""
    from collections import Counter

    from trinity.coordinator.episode import OutageError
    from trinity.coordinator.rollout import is_outage

    out = [it for it in items if it.unscored_by_outage]
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
