"""Imported first by every flow: hermetic defaults (no telemetry, no hub, local Prefect state), then the tasks a
stage flow is made of (`run_stage`) and the retry policy of every task that calls models (`LLM_BOUND_RETRIES`).

Only defaults: a user's own PREFECT_API_URL / WANDB_MODE / etc. win.
"""
import os
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
# The stage runs this checkout's own code (the code DVC tracks as the stage's deps), whichever copy of
# trinity the venv has installed.
sys.path.insert(0, str(ROOT / "src"))
os.environ.setdefault("PREFECT_HOME", str(ROOT / "data" / "prefect"))
os.environ.setdefault("DO_NOT_TRACK", "1")
os.environ.setdefault("PREFECT_SERVER_ANALYTICS_ENABLED", "false")
os.environ.setdefault("PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS", "120")
os.environ.setdefault("PREFECT_LOGGING_LEVEL", "WARNING")
os.environ.setdefault("DVC_NO_ANALYTICS", "1")
os.environ.setdefault("WANDB_SILENT", "true")
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")


# Prefect is imported only now, after the defaults above.
from prefect import task  # noqa: E402
from prefect.cache_policies import NO_CACHE  # noqa: E402
from prefect.tasks import exponential_backoff  # noqa: E402

BAD_INPUT = (ValueError, FileNotFoundError)
"""What no retry can fix: invalid params, a missing input file, a checkpoint that does not fit the params."""


def retry_unless_bad_input(task, task_run, state) -> bool:
    """Retry filter of LLM-bound tasks: an outage or a timeout is retried, bad input fails at once."""
    return not isinstance(state.result(raise_on_failure=False), BAD_INPUT)


LLM_BOUND_RETRIES = dict(retries=2, retry_delay_seconds=exponential_backoff(backoff_factor=60), retry_jitter_factor=0.5,
                         retry_condition_fn=retry_unless_bad_input)
"""Retries of a task that calls models: 60 s then 120 s (each ±50% jitter). A retried stage pays no call twice: the
store keeps every reply the failed attempt got, and evolve resumes from its last generation."""
LLM_BOUND_STAGES = frozenset({"evolve", "evaluate"})
EVAL_SCORES_ARTIFACT_KEY = "trinity-eval-scores"


def summary_artifact_key(stage: str) -> str:
    return f"trinity-{stage}-summary"


@task(name="load-params", cache_policy=NO_CACHE)
def load_params(params: str):
    """params.yaml (or another file), validated: a bad key fails here, naming the file and the key."""
    from trinity.config import load_settings

    return load_settings(params if os.path.isabs(params) else ROOT / params)


def _run(name: str, settings, tracker) -> dict:
    from trinity import stages

    return stages.run_stage(name, settings, stages.Paths(ROOT), tracker=tracker)


def _markdown(stage: str, summary: dict) -> str:
    import json

    lines = [f"# trinity {stage}", "", "| key | value |", "|---|---|"]
    for k, v in summary.items():
        text = v if isinstance(v, str) else json.dumps(v, default=str)
        lines.append(f"| {k} | {text[:300].replace('|', '/')} |")
    return "\n".join(lines) + "\n"


def eval_scores_table(results: dict) -> list[dict]:
    """data/eval/results.json as one row per benchmark and method (docs/eval_results_schema.md)."""
    split = {b["name"]: b["split"] for b in results.get("benchmarks", [])}
    rows = []
    for method, per in results.get("scores", {}).items():
        for bench, cell in per.items():
            ci = cell.get("ci95") or [None, None]
            rows.append({"benchmark": bench, "split": split.get(bench), "method": method, "score": cell.get("score"),
                         "ci95_low": ci[0], "ci95_high": ci[1], "n": cell.get("n"), "calls_new": cell.get("calls_new")})
    return sorted(rows, key=lambda r: (r["split"] or "", r["benchmark"]))


@task(name="publish-artifacts", cache_policy=NO_CACHE)
def publish_artifacts(stage: str, summary: dict) -> list[str]:
    """The stage's summary as a markdown artifact, under a stable key (one version per run); evaluate adds the
    per-benchmark table."""
    import json

    from prefect.artifacts import create_markdown_artifact, create_table_artifact
    from trinity.stages import Paths

    keys = [summary_artifact_key(stage)]
    create_markdown_artifact(_markdown(stage, summary), key=keys[0], description=f"trinity {stage} stage summary")
    results = Paths(ROOT).eval_dir / "results.json"
    if stage == "evaluate" and results.exists():
        create_table_artifact(eval_scores_table(json.loads(results.read_text())), key=EVAL_SCORES_ARTIFACT_KEY,
                              description="every method's score per benchmark, with its 95% interval")
        keys.append(EVAL_SCORES_ARTIFACT_KEY)
    return keys


def run_stage(name: str, params: str = "params.yaml", summarize=None, timeout_minutes: float | None = None) -> dict:
    """The body of every stage flow, as tasks: load-params (validated params), the stage itself (a task named
    after it: trinity.stages.run_stage inside the stage's W&B run; models are called in evolve and evaluate,
    which retry an outage with exponential backoff and jitter and stop after `timeout_minutes`), and
    publish-artifacts. No Prefect result cache here: what is costly to recompute — every LLM reply and hidden
    state — is cached across runs by content in the store, and stage outputs by DVC; a cached summary would stand
    for files it does not rebuild."""
    from trinity.tracking import StageRun

    settings = load_params(params)
    options = dict(LLM_BOUND_RETRIES) if name in LLM_BOUND_STAGES else {}
    if timeout_minutes is not None:
        options["timeout_seconds"] = timeout_minutes * 60
    stage_task = task(_run, name=name, cache_policy=NO_CACHE, **options)
    with StageRun(settings, name, root=ROOT) as run:
        out = stage_task(name, settings, run)
        summary = summarize(out) if summarize else out
        run.summary(summary)
    publish_artifacts(name, summary)
    print(f"[{name}] {summary}")
    return out


def check_prefect_api() -> None:
    """A PREFECT_API_URL that does not answer stops the run here, naming it (exit status 2), before anything runs.
    Unset: Prefect starts an ephemeral API for the run."""
    from prefect.client.orchestration import get_client
    from prefect.settings import get_current_settings

    url = get_current_settings().api.url
    if not url:
        return
    with get_client(sync_client=True) as client:
        err = client.api_healthcheck()
    if err is not None:
        print(f"error: the Prefect API at {url} (PREFECT_API_URL) is unreachable: {type(err).__name__}: {err}. "
              "Start that server, or unset PREFECT_API_URL to run on an ephemeral API", file=sys.stderr)
        sys.exit(2)


def main(flow_fn) -> None:
    """`python flows/<stage>.py [--params FILE]`: what `dvc repro` runs."""
    import argparse

    from trinity.process_guard import guard_this_process

    ap = argparse.ArgumentParser(description=flow_fn.__doc__)
    ap.add_argument("--params", default="params.yaml")
    args = ap.parse_args()
    check_prefect_api()
    guard_this_process()  # the ephemeral Prefect server, Dask workers etc. end with this process, even on SIGKILL
    flow_fn(args.params)
