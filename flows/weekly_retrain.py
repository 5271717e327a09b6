"""Prefect flow `trinity-weekly-retrain` (deployment `weekly-retrain` in prefect.yaml): bring this checkout to the
branch it follows (`git fetch`, then a fast-forward only — never a merge; a checkout that cannot fast-forward is
refused, naming why), then ask `dvc status` whether data, params or code changed since the outputs were made.
When nothing did, the run ends Completed with "nothing changed, nothing retrained" and runs nothing else. When
something did: `dvc repro` (the pipeline, resumable: what is up to date does not run again), then `dvc push` of
the data and the checkpoint to the DVC remote, then a git commit of dvc.lock and reports/ — the lock file is what
names the pushed outputs, so a clone at that commit gets them with `dvc pull` — proposed for review on a branch
of its own (`retrain/<UTC time>-<run name>`), pushed to `git_remote` when one is given: the retrained model reaches
the followed branch only when someone merges it (and the next run fast-forwards to it: then nothing changed).
The DVC remote, the git work tree, the branch followed and the git remote are checked first, so a missing one fails
the run before anything changes or any model is called. From then on the run holds the store's writer lock
(trinity.ops.checkout_lock: `trinity serve` writes the same store, so a retrain while one serves is refused before it
fetches anything, naming it). The stages `dvc repro` runs are this checkout's code after the fast-forward; this
flow's own code is what the run started with.

`python flows/weekly_retrain.py [--dvc-remote NAME] [--git-remote NAME] [--follow REMOTE/BRANCH]` runs it once,
without a deployment.
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
from prefect.states import Completed, Failed
from prefect.tasks import exponential_backoff

from trinity.ops.checkout_lock import StoreBusy, StoreLock, run_holding_checkout

RETRAIN_ARTIFACT_KEY = "weekly-retrain-summary"
NOTHING_CHANGED = "nothing changed, nothing retrained"


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
    from trinity.ops.dvc_remote import resolve_dvc_remote

    return resolve_dvc_remote(ROOT, dvc_remote)


@task(name="check-git", cache_policy=NO_CACHE)
def check_git(git_remote: str | None, follow: str | None) -> str:
    """The work tree, the git remote the proposal goes to, and the branch the checkout follows (its remote has
    it); returns "<remote>/<branch>"."""
    from trinity.ops.git_checkout import check_follow, resolve_git_remote

    resolve_git_remote(ROOT, git_remote)
    return check_follow(ROOT, follow)


@task(name="git-fast-forward", cache_policy=NO_CACHE)
def git_fast_forward(follow: str | None):
    """`git fetch` of the followed branch, then a fast-forward of the checkout's branch to it (never a merge)."""
    from trinity.ops.git_checkout import fast_forward

    ff = fast_forward(ROOT, follow)
    print(f"[retrain] {ff.message()}" + (f"; set back {list(ff.restored)} (the incoming commits bring the same "
                                         "content)" if ff.restored else ""))
    return ff


@task(name="dvc-status", cache_policy=NO_CACHE)
def dvc_status() -> dict:
    """What changed since the outputs were made (`dvc status`): {} when nothing did."""
    from trinity.ops.git_checkout import pipeline_changes

    changes = pipeline_changes(ROOT, _dvc_env())
    if changes:
        print(f"[retrain] `dvc status`: {len(changes)} stage(s) or output(s) changed: "
              f"{json.dumps(changes)[:1500]}")
    else:
        print("[retrain] `dvc status`: data and pipelines are up to date")
    return changes


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

    from trinity.ops.git_checkout import propose_pipeline_state

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
def publish_summary(remote: str, commit: str | None, branch: str, git_remote: str | None, sync,
                    changes: dict | None) -> str:
    import subprocess as sp

    head = commit or sp.run(["git", "rev-parse", "HEAD"], cwd=ROOT, capture_output=True, text=True).stdout.strip()
    lines = ["# Weekly retrain", "", f"Checkout `{ROOT}`: {sync.message()}.", ""]
    if not changes:
        lines += [f"**{NOTHING_CHANGED}**: `dvc status` finds data, params and code as the outputs of `{head[:12]}` "
                  "were made; no `dvc repro`, no push, no commit.", ""]
    else:
        lines += [f"`dvc status` found {', '.join(sorted(changes))} changed; `dvc repro` then `dvc push -r "
                  f"{remote}`.", "",
                  (f"dvc.lock and reports/ committed as `{commit}` on branch `{branch}`, proposed for review (merge "
                   "it to adopt the retrained model)" if commit else
                   f"Nothing changed in dvc.lock or reports/: the outputs are those of `{head or 'no commit yet'}`")
                  + (f", pushed to git remote `{git_remote}`" if git_remote and commit else
                     "" if not commit else " (no git_remote: the branch stays in this checkout)")
                  + f". Anywhere: `git checkout {head[:12] or '<commit>'} && dvc pull`.", ""]
    for name, path in (("evolve", "reports/metrics/evolve.json"), ("evaluate", "reports/metrics/evaluate.json")):
        p = ROOT / path
        if p.exists():
            lines += [f"## {name} (`{path}`)", "", "```json", json.dumps(json.loads(p.read_text()), indent=1)[:4000],
                      "```", ""]
    create_markdown_artifact("\n".join(lines), key=RETRAIN_ARTIFACT_KEY,
                             description=NOTHING_CHANGED if not changes else f"pushed to {remote}")
    return RETRAIN_ARTIFACT_KEY


@flow(name="trinity-weekly-retrain", log_prints=True)
def weekly_retrain_flow(dvc_remote: str | None = None, git_remote: str | None = None, follow: str | None = None):
    """Fast-forward the checkout to the branch it follows (`follow`, "<remote>/<branch>"; None: its branch's
    upstream); when `dvc status` finds a change: `dvc repro`, then `dvc push` to `dvc_remote` (None: the checkout's
    default DVC remote), then a commit of dvc.lock and reports/, pushed to `git_remote` (None: kept in the
    checkout); when not, Completed with "nothing changed, nothing retrained". Refused (Cancelled) while another
    run holds the checkout, Failed while `trinity serve` holds the store."""
    return run_holding_checkout(ROOT, "retrain", _retrain, dvc_remote, git_remote, follow)


def _retrain(dvc_remote: str | None, git_remote: str | None, follow: str | None):
    from prefect.runtime import flow_run

    from trinity.stages.paths import store_path

    remote = check_dvc_remote(dvc_remote)
    check_git(git_remote, follow)
    holder = f"weekly-retrain run {flow_run.get_name() or 'outside a deployment'}"
    try:
        lock = StoreLock(store_path(ROOT), holder)
    except StoreBusy as e:
        message = (f"{e}: `dvc repro` writes that store, and DuckDB lets one process write it; stop that process "
                   "(or let it serve a copy of the store: `trinity serve --store <copy>`) and run weekly-retrain again")
        print(f"[retrain] {message}")
        return Failed(message=message)
    with lock:
        return _retrain_holding_store(remote, git_remote, follow)


def _retrain_holding_store(remote: str, git_remote: str | None, follow: str | None):
    """Everything that changes the checkout, while this run holds the store's writer lock."""
    sync = git_fast_forward(follow)
    changes = dvc_status()
    if not changes:
        artifact = publish_summary(remote, None, "", git_remote, sync, changes)
        message = f"{NOTHING_CHANGED}: {sync.message()}; `dvc status` finds data, params and code unchanged"
        print(f"[retrain] {message}")
        return Completed(message=message, data={"remote": remote, "commit": None, "branch": None, "retrained": False,
                                                "head": sync.after, "artifact": artifact})
    dvc_repro()
    dvc_push(remote)
    commit, branch = git_commit(remote)
    if git_remote and commit:
        git_push(git_remote, branch)
    artifact = publish_summary(remote, commit, branch, git_remote, sync, changes)
    message = (f"retrained ({', '.join(sorted(changes))} changed; {sync.message()}): "
               + (f"proposed {commit[:12]} on branch {branch}" if commit else "dvc.lock and reports/ unchanged"))
    return Completed(message=message, data={"remote": remote, "commit": commit, "branch": branch if commit else None,
                                            "retrained": True, "head": sync.after, "artifact": artifact})


if __name__ == "__main__":
    import argparse

    from _bootstrap import check_prefect_api

    ap = argparse.ArgumentParser(description=weekly_retrain_flow.__doc__)
    ap.add_argument("--dvc-remote", default=None)
    ap.add_argument("--git-remote", default=None)
    ap.add_argument("--follow", default=None, help="<remote>/<branch> (default: the checkout branch's upstream)")
    args = ap.parse_args()
    check_prefect_api()
    weekly_retrain_flow(args.dvc_remote, args.git_remote, args.follow)
