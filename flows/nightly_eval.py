"""Prefect flow `trinity-nightly-eval` (deployment `nightly-eval` in prefect.yaml): re-evaluate the current
checkpoint with fresh calls on the night's own items (`items_per_benchmark` of every evaluation benchmark: enough
for the drop test to call a drop), compare with the previous night, publish the result as Prefect artifacts, and
end the run Failed when a score dropped beyond `drop_threshold` (trinity.ops.nightly says how).

`python flows/nightly_eval.py [--params FILE] [--items-per-benchmark N]` runs it once, without a deployment.
"""
from _bootstrap import ROOT  # hermetic defaults and this checkout's src/ first, before prefect is imported

import dataclasses
from pathlib import Path

from prefect import flow, task
from prefect.artifacts import create_markdown_artifact, create_table_artifact
from prefect.cache_policies import NO_CACHE
from prefect.runtime import flow_run
from prefect.states import Failed

from trinity.ops.checkout_lock import run_holding_checkout
from trinity.ops.nightly import DEFAULT_ITEMS_PER_BENCHMARK
from trinity.ops.stage_flow import LLM_BOUND_RETRIES


def _params_path(params: str) -> Path:
    return Path(params) if Path(params).is_absolute() else ROOT / params


@task(name="check-inputs", cache_policy=NO_CACHE)
def check_inputs(params: str, drop_threshold: float, items_per_benchmark: int, run_dir: str) -> dict:
    """Everything that can be wrong, before any model is called: the threshold and item count, params, the
    checkpoint and the prepared splits it was trained on, the benchmarks the night's items are drawn from, the
    pool's configuration, and the previous night's record. The night's items are written to `run_dir`."""
    from trinity.ops import nightly
    from trinity.config import load_settings
    from trinity.pool.members import check_pool_config
    from trinity.stages.common import load_tasks as _load_tasks
    from trinity.stages.paths import Paths

    nightly.check_threshold(drop_threshold)
    nightly.check_items_per_benchmark(items_per_benchmark)
    settings = load_settings(_params_path(params))
    check_pool_config(settings.pool)
    paths = Paths(ROOT)
    for suffix in (".npy", ".json"):
        if not paths.checkpoint.with_suffix(suffix).exists():
            raise FileNotFoundError(f"{paths.checkpoint.with_suffix(suffix)} is missing: train a coordinator first "
                                    "(dvc repro, or the weekly-retrain deployment)")
    splits = nightly.nightly_splits(settings, _load_tasks(paths), items_per_benchmark)
    nightly.write_nightly_splits(nightly.NightlyPaths(ROOT, run_dir=Path(run_dir)), splits)
    previous = nightly.baseline_record(ROOT)
    counts = nightly.items_by_benchmark(splits)
    return {"in_distribution": len(splits.in_distribution), "heldout": len(splits.heldout), "items": counts,
            "short": {b: c for b, c in counts.items() if c < items_per_benchmark},
            "previous_run": previous.run if previous else None}


@task(name="evaluate-checkpoint", cache_policy=NO_CACHE, **LLM_BOUND_RETRIES)
def evaluate_checkpoint(params: str, run_dir: str):
    """The evaluate stage's code on a fresh store in `run_dir` (every call made again: no stored reply hides a
    changed model). A retry resumes from the calls the failed attempt stored in the same directory."""
    from trinity.config import load_settings
    from trinity.evaluation.results import EvalResults
    from trinity.ops.nightly import NightlyPaths
    from trinity.stages import run_stage

    run_stage("evaluate", load_settings(_params_path(params)), NightlyPaths(ROOT, run_dir=Path(run_dir)))
    return EvalResults.read(Path(run_dir) / "results.json")


@task(name="compare-with-previous", cache_policy=NO_CACHE)
def compare_with_previous(results, run: str, run_dir: str, drop_threshold: float):
    from trinity.ops import nightly

    current = nightly.NightlyRecord.from_results(results, run=run,
                                                 results_path=Path(run_dir).relative_to(ROOT) / "results.json",
                                                 episodes=Path(run_dir) / "episodes.jsonl")
    comparison = nightly.compare(nightly.baseline_record(ROOT), current, drop_threshold)
    return dataclasses.replace(current, flagged=comparison.flagged), comparison


@task(name="publish-artifacts", cache_policy=NO_CACHE)
def publish_artifacts(current, comparison) -> dict:
    """The markdown summary and the per-benchmark table, under stable keys (one version per night), and the
    night's record appended to data/nightly/history.jsonl (tomorrow's baseline, unless it was flagged)."""
    from trinity.ops import nightly

    create_markdown_artifact(nightly.summary_markdown(current, comparison), key=nightly.SUMMARY_ARTIFACT_KEY,
                             description=comparison.message())
    create_table_artifact(nightly.scores_table(comparison), key=nightly.SCORES_ARTIFACT_KEY,
                          description=f"every method's score per benchmark (fraction of scale), {current.run}")
    history = nightly.append_record(ROOT, current)
    return {"artifacts": [nightly.SUMMARY_ARTIFACT_KEY, nightly.SCORES_ARTIFACT_KEY], "history": str(history)}


@flow(name="trinity-nightly-eval", log_prints=True)
def nightly_eval_flow(params: str = "params.yaml", drop_threshold: float = 0.05, timeout_minutes: float = 240.0,
                      items_per_benchmark: int = DEFAULT_ITEMS_PER_BENCHMARK):
    """Re-evaluate the current checkpoint with fresh calls on `items_per_benchmark` items of every evaluation
    benchmark; fail the run when a score drops beyond drop_threshold (a fraction of the benchmark's scale) since the
    last night that passed. Refused (Cancelled) while another run holds the checkout."""
    return run_holding_checkout(ROOT, "nightly", _nightly, params, drop_threshold, timeout_minutes,
                                items_per_benchmark)


def _nightly(params: str, drop_threshold: float, timeout_minutes: float, items_per_benchmark: int):
    from trinity.ops.nightly import MIN_ITEMS_FOR_OUTCOME, new_run_dir

    run = flow_run.get_name() or "local"
    run_dir = new_run_dir(ROOT, run)
    inputs = check_inputs(params, drop_threshold, items_per_benchmark, str(run_dir))
    print(f"[nightly] evaluating the checkpoint on {inputs['in_distribution']} in-distribution and "
          f"{inputs['heldout']} held-out items ({items_per_benchmark} per benchmark: "
          f"{', '.join(f'{b} {n}' for b, n in inputs['items'].items())}); baseline (the last night not flagged): "
          f"{inputs['previous_run'] or 'none'}")
    if inputs["short"]:
        print(f"[nightly] fewer than {items_per_benchmark} items exist for {inputs['short']} (after leaving out "
              f"what the checkpoint was trained and selected on)"
              + (f"; below {MIN_ITEMS_FOR_OUTCOME}, no drop can be called there" if
                 min(inputs["short"].values()) < MIN_ITEMS_FOR_OUTCOME else ""))
    results = evaluate_checkpoint.with_options(timeout_seconds=timeout_minutes * 60)(params, str(run_dir))
    current, comparison = compare_with_previous(results, run, str(run_dir), drop_threshold)
    published = publish_artifacts(current, comparison)
    print(f"[nightly] {comparison.message()}")
    if comparison.flagged:
        return Failed(message=comparison.message())
    return {"run_dir": str(run_dir), "message": comparison.message(), **published}


if __name__ == "__main__":
    import argparse

    from _bootstrap import check_prefect_api
    from trinity.ops.process_guard import guard_this_process

    ap = argparse.ArgumentParser(description=nightly_eval_flow.__doc__)
    ap.add_argument("--params", default="params.yaml")
    ap.add_argument("--items-per-benchmark", type=int, default=DEFAULT_ITEMS_PER_BENCHMARK)
    args = ap.parse_args()
    check_prefect_api()
    guard_this_process()
    nightly_eval_flow(args.params, items_per_benchmark=args.items_per_benchmark)
