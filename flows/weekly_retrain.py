"""Prefect flow `trinity-weekly-retrain` (deployment `weekly-retrain` in prefect.yaml): `dvc repro` in this
checkout (the pipeline, resumable: what is up to date does not run again), then `dvc push` of the data and the
checkpoint to the DVC remote, then a git commit of dvc.lock and reports/ — the lock file is what names the
pushed outputs, so a clone at that commit gets them with `dvc pull` — proposed for review on a branch of its
own (`retrain/<UTC time>-<run name>`), pushed to `git_remote` when one is given: the retrained model reaches
the main branch only when someone merges it.
The DVC remote, the git work tree and the git remote are checked before the pipeline starts, so a missing one
fails the run before any model is called.

`python flows/weekly_retrain.py [--dvc-remote NAME] [--git-remote NAME]` runs it once, without a deployment.
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

from trinity.ops.checkout_lock import run_holding_checkout

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
    from trinity.ops.deploy import resolve_dvc_remote

    return resolve_dvc_remote(ROOT, dvc_remote)


@task(name="check-git", cache_policy=NO_CACHE)
def check_git(git_remote: str | None) -> str | None:
    from trinity.ops.deploy import resolve_git_remote

    return resolve_git_remote(ROOT, git_remote)


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


def proposal_branch(run_name: str | None) -> str:
    from datetime import datetime, timezone

    safe = "".join(c if c.isalnum() or c in "-_" else "-" for c in (run_name or "local"))[:48]
    return f"retrain/{datetime.now(timezone.utc).strftime('%Y%m%dT%H%M%SZ')}-{safe}"


@task(name="git-commit", cache_policy=NO_CACHE)
def git_commit(remote: str) -> tuple[str | None, str]:
    """dvc.lock and reports/ as the pipeline left them, in a commit on a new branch (the proposal); (None, branch)
    when nothing changed."""
    from prefect.runtime import flow_run

    from trinity.ops.deploy import propose_pipeline_state

    name = flow_run.get_name()
    branch = proposal_branch(name)
    commit = propose_pipeline_state(ROOT, branch, f"weekly-retrain{' ' + name if name else ''}: dvc.lock and "
                                                  f"reports of the outputs pushed to DVC remote {remote}")
    print(f"[retrain] proposed {commit} on branch {branch}" if commit else
          "[retrain] nothing changed in dvc.lock or reports/: no commit")
    return commit, branch


@task(name="git-push", cache_policy=NO_CACHE, retries=3, retry_delay_seconds=exponential_backoff(backoff_factor=10),
      retry_jitter_factor=0.5)
def git_push(git_remote: str, branch: str) -> None:
    """The proposal's branch (never the checkout's own branch) to `git_remote`, for review."""
    _run_streaming(["git", "push", git_remote, f"refs/heads/{branch}:refs/heads/{branch}"])


@task(name="publish-retrain-summary", cache_policy=NO_CACHE)
def publish_summary(remote: str, commit: str | None, branch: str, git_remote: str | None) -> str:
    import subprocess as sp

    head = commit or sp.run(["git", "rev-parse", "HEAD"], cwd=ROOT, capture_output=True, text=True).stdout.strip()
    lines = ["# Weekly retrain", "", f"`dvc repro` then `dvc push -r {remote}` in `{ROOT}`.", "",
             (f"dvc.lock and reports/ committed as `{commit}` on branch `{branch}`, proposed for review (merge it to "
              "adopt the retrained model)" if commit else
              f"Nothing changed in dvc.lock or reports/: the outputs are those of `{head or 'no commit yet'}`")
             + (f", pushed to git remote `{git_remote}`" if git_remote and commit else
                "" if not commit else " (no git_remote: the branch stays in this checkout)")
             + f". Anywhere: `git checkout {head[:12] or '<commit>'} && dvc pull`.", ""]
    for name, path in (("evolve", "reports/metrics/evolve.json"), ("evaluate", "reports/metrics/evaluate.json")):
        p = ROOT / path
        if p.exists():
            lines += [f"## {name} (`{path}`)", "", "```json", json.dumps(json.loads(p.read_text()), indent=1)[:4000],
                      "```", ""]
    create_markdown_artifact("\n".join(lines), key=RETRAIN_ARTIFACT_KEY, description=f"pushed to {remote}")
    return RETRAIN_ARTIFACT_KEY


@flow(name="trinity-weekly-retrain", log_prints=True)
def weekly_retrain_flow(dvc_remote: str | None = None, git_remote: str | None = None) -> dict:
    """`dvc repro`, then `dvc push` to `dvc_remote` (None: the checkout's default DVC remote), then a commit of
    dvc.lock and reports/, pushed to `git_remote` (None: kept in the checkout). Refused (Cancelled) while another
    run holds the checkout."""
    return run_holding_checkout(ROOT, "retrain", _retrain, dvc_remote, git_remote)


def _retrain(dvc_remote: str | None, git_remote: str | None) -> dict:
    remote = check_dvc_remote(dvc_remote)
    check_git(git_remote)
    dvc_repro()
    dvc_push(remote)
    commit, branch = git_commit(remote)
    if git_remote and commit:
        git_push(git_remote, branch)
    return {"remote": remote, "commit": commit, "branch": branch if commit else None,
            "artifact": publish_summary(remote, commit, branch, git_remote)}


if __name__ == "__main__":
    import argparse

    ap = argparse.ArgumentParser(description=weekly_retrain_flow.__doc__)
    ap.add_argument("--dvc-remote", default=None)
    ap.add_argument("--git-remote", default=None)
    args = ap.parse_args()
    weekly_retrain_flow(args.dvc_remote, args.git_remote)
