"""Prefect flow `trinity-weekly-retrain` (deployment `weekly-retrain` in prefect.yaml): `dvc repro` in this
checkout (the pipeline, resumable: what is up to date does not run again), then `dvc push` of the data and the
checkpoint to the DVC remote. The remote is checked before the pipeline starts, so a missing one fails the run
before any model is called.

`python flows/weekly_retrain.py [--dvc-remote NAME]` runs it once, without a deployment.
"""
from _bootstrap import ROOT  # hermetic defaults before prefect is imported

import json
import os
import subprocess
import sys
from pathlib import Path

from prefect import flow, task
from prefect.artifacts import create_markdown_artifact
from prefect.cache_policies import NO_CACHE
from prefect.tasks import exponential_backoff

RETRAIN_ARTIFACT_KEY = "weekly-retrain-summary"


def _dvc_env() -> dict:
    """The stages run `python flows/<stage>.py`: this interpreter's venv first on PATH (as `make run` does)."""
    return {**os.environ, "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}"}


def _run_streaming(cmd: list[str]) -> None:
    """Run a command in the checkout, every output line to the run's log and the terminal as it comes."""
    print(f"[retrain] $ {' '.join(cmd)}")
    with subprocess.Popen(cmd, cwd=ROOT, env=_dvc_env(), stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                          text=True, bufsize=1) as proc:
        for line in proc.stdout:
            print(line.rstrip("\n"))
    if proc.returncode != 0:
        raise RuntimeError(f"`{' '.join(cmd)}` failed in {ROOT} (exit {proc.returncode}); its output is above")


@task(name="check-dvc-remote", cache_policy=NO_CACHE)
def check_dvc_remote(dvc_remote: str | None) -> str:
    from trinity.deploy import resolve_dvc_remote

    return resolve_dvc_remote(ROOT, dvc_remote)


@task(name="dvc-repro", cache_policy=NO_CACHE)
def dvc_repro() -> None:
    """The pipeline; a stage interrupted half-way resumes where it stopped on the next run (evolve's exact resume
    and the store), so a failure is left to the next schedule rather than retried here."""
    _run_streaming([sys.executable, "-m", "dvc", "repro"])


@task(name="dvc-push", cache_policy=NO_CACHE, retries=3, retry_delay_seconds=exponential_backoff(backoff_factor=10),
      retry_jitter_factor=0.5)
def dvc_push(remote: str) -> None:
    """The outputs DVC tracks (prepared data, encoded states, checkpoint, evaluation) to the remote; a network
    failure is retried with exponential backoff."""
    _run_streaming([sys.executable, "-m", "dvc", "push", "-r", remote])


@task(name="publish-retrain-summary", cache_policy=NO_CACHE)
def publish_summary(remote: str) -> str:
    lines = ["# Weekly retrain", "", f"`dvc repro` then `dvc push -r {remote}` in `{ROOT}`.", ""]
    for name, path in (("evolve", "data/evolve/metrics.json"), ("evaluate", "data/eval/metrics.json")):
        p = ROOT / path
        if p.exists():
            lines += [f"## {name} (`{path}`)", "", "```json", json.dumps(json.loads(p.read_text()), indent=1)[:4000],
                      "```", ""]
    create_markdown_artifact("\n".join(lines), key=RETRAIN_ARTIFACT_KEY, description=f"pushed to {remote}")
    return RETRAIN_ARTIFACT_KEY


@flow(name="trinity-weekly-retrain", log_prints=True)
def weekly_retrain_flow(dvc_remote: str | None = None) -> dict:
    """`dvc repro`, then `dvc push` to `dvc_remote` (None: the checkout's default DVC remote)."""
    remote = check_dvc_remote(dvc_remote)
    dvc_repro()
    dvc_push(remote)
    return {"remote": remote, "artifact": publish_summary(remote)}


if __name__ == "__main__":
    import argparse

    ap = argparse.ArgumentParser(description=weekly_retrain_flow.__doc__)
    ap.add_argument("--dvc-remote", default=None)
    weekly_retrain_flow(ap.parse_args().dvc_remote)
