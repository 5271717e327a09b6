"""The tasks a stage flow is made of (`run_stage`: load-params, the stage, publish-artifacts) and the retry policy
of every task that calls models (`LLM_BOUND_RETRIES`).

A package module, not a flow script's: a Dask worker unpickles every task it runs together with the Prefect
context it was submitted from, which names the enclosing stage task, so that task's function must be importable
wherever trinity is installed (a function of `flows/` is not). Import it after `flows/_bootstrap.py` (its hermetic
defaults come before Prefect is imported); the stage's project root is the checkout this module was imported from
(`_bootstrap` puts the checkout's `src/` first on sys.path).
"""
import os

from prefect import task
from prefect.cache_policies import NO_CACHE
from prefect.tasks import exponential_backoff

from trinity.config import PROJECT_ROOT as ROOT

BAD_INPUT = (ValueError, FileNotFoundError)
"""What no retry can fix: invalid params, a missing input file, a checkpoint that does not fit the params."""


def retry_unless_bad_input(task, task_run, state) -> bool:
    """Retry filter of LLM-bound tasks: an outage or a timeout is retried, bad input fails at once. An outage reaches
    here as `trinity.coordinator.episode.OutageError`: pool calls return a failed reply rather than raise, so the
    evolve and evaluate stages raise it themselves when outages left their work unranked or unscored."""
    return not isinstance(state.result(raise_on_failure=False), BAD_INPUT)  # OutageError is a RuntimeError


LLM_BOUND_RETRIES = dict(retries=2, retry_delay_seconds=exponential_backoff(backoff_factor=60), retry_jitter_factor=0.5,
                         retry_condition_fn=retry_unless_bad_input)
"""Retries of a task that calls models: 60 s then 120 s (each ±50% jitter). A retried stage pays no call twice: the
store keeps every reply the failed attempt got (never an outage: those are asked again), and evolve resumes from its
last checkpointed generation. What fires them: an `OutageError` (evolve: a candidate left with no episode free of
an outage; evaluate: items unscored by an outage, raised after its results are written), a timeout, a crash."""
LLM_BOUND_STAGES = frozenset({"evolve", "router", "evaluate"})
@task(name="load-params", cache_policy=NO_CACHE)
def load_params(params: str):
    """params.yaml (or another file), validated: a bad key fails here, naming the file and the key."""
    from trinity.config import load_settings

    return load_settings(params if os.path.isabs(params) else ROOT / params)


_TRACKERS: dict[str, object] = {}
"""The W&B run of each stage task running in this process, by id. The task takes the id, not the run: a task's
parameters travel in the Prefect context of every task it submits (evolve's node expansions, to Dask workers),
and a W&B run does not pickle."""


def run_stage_task(name: str, settings, tracker_id: str) -> dict:
    """The stage task's body: trinity.stages.run_stage, logging to the W&B run registered under tracker_id."""
    from trinity.stages import run_stage
    from trinity.stages.paths import Paths

    return run_stage(name, settings, Paths(ROOT), tracker=_TRACKERS[tracker_id])


def run_stage(name: str, params: str = "params.yaml", timeout_minutes: float | None = None) -> dict:
    """The body of every stage flow, as tasks: load-params (validated params), the stage itself (a task named
    after it: trinity.stages.run_stage inside the stage's W&B run; models are called in evolve and evaluate,
    which retry an outage with exponential backoff and jitter and stop after `timeout_minutes`), and
    publish-artifacts. No Prefect result cache here: what is costly to recompute — every LLM reply and hidden
    state — is cached across runs by content in the store, and stage outputs by DVC; a cached summary would stand
    for files it does not rebuild."""
    import uuid

    from trinity.ops.prefect_artifacts import publish_artifacts
    from trinity.ops.tracking import StageRun

    settings = load_params(params)
    options = dict(LLM_BOUND_RETRIES) if name in LLM_BOUND_STAGES else {}
    if timeout_minutes is not None:
        options["timeout_seconds"] = timeout_minutes * 60
    stage_task = task(run_stage_task, name=name, cache_policy=NO_CACHE, **options)
    tracker_id = uuid.uuid4().hex
    with StageRun(settings, name, root=ROOT) as run:
        _TRACKERS[tracker_id] = run
        try:
            out = stage_task(name, settings, tracker_id)
        finally:
            _TRACKERS.pop(tracker_id, None)
        run.summary(out)
    publish_artifacts(name, out)
    print(f"[{name}] {out}")
    return out
