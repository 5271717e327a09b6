"""What a stage flow shows in the Prefect UI: the stage's summary as a markdown artifact and, for evaluate, the
per-benchmark score table. Display only: it writes no file DVC tracks (the tests' DVC-deps check leaves it out, as it
does W&B logging)."""
from __future__ import annotations

from prefect import task
from prefect.cache_policies import NO_CACHE

from trinity.config import PROJECT_ROOT as ROOT

EVAL_SCORES_ARTIFACT_KEY = "trinity-eval-scores"


def summary_artifact_key(stage: str) -> str:
    return f"trinity-{stage}-summary"


def _markdown(stage: str, summary: dict) -> str:
    import json

    lines = [f"# trinity {stage}", "", "| key | value |", "|---|---|"]
    for k, v in summary.items():
        text = v if isinstance(v, str) else json.dumps(v, default=str)
        lines.append(f"| {k} | {text[:300].replace('|', '/')} |")
    return "\n".join(lines) + "\n"


def eval_scores_table(results) -> list[dict]:
    """data/eval/results.json (a `trinity.evaluation.results.EvalResults`) as one row per benchmark and method
    (docs/eval_results_schema.md)."""
    split = {b.name: b.split for b in results.benchmarks}
    rows = []
    for method, per in results.scores.items():
        for bench, cell in per.items():
            low, high = cell.ci95 or (None, None)
            rows.append({"benchmark": bench, "split": split.get(bench), "method": method, "score": cell.score,
                         "ci95_low": low, "ci95_high": high, "n": cell.n, "calls_new": cell.calls_new})
    return sorted(rows, key=lambda r: (r["split"] or "", r["benchmark"]))


@task(name="publish-artifacts", cache_policy=NO_CACHE)
def publish_artifacts(stage: str, summary: dict) -> list[str]:
    """The stage's summary as a markdown artifact, under a stable key (one version per run); evaluate adds the
    per-benchmark table."""
    from prefect.artifacts import create_markdown_artifact, create_table_artifact
    from trinity.evaluation.results import EvalResults
    from trinity.stages.paths import Paths

    keys = [summary_artifact_key(stage)]
    create_markdown_artifact(_markdown(stage, summary), key=keys[0], description=f"trinity {stage} stage summary")
    results = Paths(ROOT).eval_dir / "results.json"
    if stage == "evaluate" and results.exists():
        create_table_artifact(eval_scores_table(EvalResults.read(results)), key=EVAL_SCORES_ARTIFACT_KEY,
                              description="every method's score per benchmark, with its 95% interval")
        keys.append(EVAL_SCORES_ARTIFACT_KEY)
    return keys
