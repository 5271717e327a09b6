"""weekly-retrain's git side (trinity.ops.deploy): the work tree and git remote checked by name, and the commit that
records what the pipeline pushed — dvc.lock, reports/, DVC's .gitignore entries — and nothing else, proposed on a
branch of its own: the checkout's branch, index and work tree untouched."""
from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from trinity.ops.deploy import FALLBACK_AUTHOR, GitError, propose_pipeline_state, resolve_git_remote


def _git(cwd: Path, *args: str, env: dict | None = None) -> str:
    r = subprocess.run(["git", *args], cwd=cwd, capture_output=True, text=True, env=env)
    assert r.returncode == 0, r.stderr
    return r.stdout


@pytest.fixture
def checkout(tmp_path, monkeypatch):
    # no global identity: what a scheduled worker often has
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    monkeypatch.setenv("GIT_CONFIG_NOSYSTEM", "1")
    for k in ("GIT_AUTHOR_NAME", "GIT_AUTHOR_EMAIL", "GIT_COMMITTER_NAME", "GIT_COMMITTER_EMAIL"):
        monkeypatch.delenv(k, raising=False)
    repo = tmp_path / "repo"
    repo.mkdir()
    _git(repo, "init", "-q")
    (repo / "dvc.yaml").write_text("stages: {}\n")
    (repo / "notes.txt").write_text("mine\n")
    _git(repo, "add", "-A")
    _git(repo, "-c", "user.name=u", "-c", "user.email=u@u", "commit", "-q", "-m", "init")
    return repo


def test_proposes_the_pipeline_state_on_a_branch_and_leaves_everything_else_alone(checkout):
    assert propose_pipeline_state(checkout, "retrain/a", "nothing yet") is None  # nothing changed: no commit
    main = _git(checkout, "rev-parse", "HEAD").strip()
    branch = _git(checkout, "branch", "--show-current").strip()
    (checkout / "dvc.lock").write_text("schema: '2.0'\n")
    (checkout / "reports" / "plots").mkdir(parents=True)
    (checkout / "reports" / "summary.md").write_text("# s\n")
    (checkout / "reports" / "plots" / "fitness.png").write_bytes(b"\x89PNG")
    (checkout / "data").mkdir()
    (checkout / "data" / ".gitignore").write_text("/checkpoints\n")
    (checkout / "notes.txt").write_text("mine, edited\n")  # the user's edit: not ours to commit
    (checkout / "scratch.py").write_text("x = 1\n")
    _git(checkout, "add", "scratch.py")  # the user's staged file: the proposal must not take it
    status = _git(checkout, "status", "--porcelain")
    commit = propose_pipeline_state(checkout, "retrain/b", "weekly-retrain test: dvc.lock")
    assert commit == _git(checkout, "rev-parse", "retrain/b").strip()
    assert _git(checkout, "rev-parse", "HEAD").strip() == main  # the checkout's branch did not move
    assert _git(checkout, "branch", "--show-current").strip() == branch
    assert _git(checkout, "status", "--porcelain") == status  # nor its index and work tree
    assert _git(checkout, "rev-parse", f"{commit}^").strip() == main
    files = set(_git(checkout, "show", "--name-only", "--format=", commit).split())
    assert files == {"dvc.lock", "reports/summary.md", "reports/plots/fitness.png", "data/.gitignore"}
    assert _git(checkout, "log", "-1", "--format=%an <%ae>|%s", commit).strip() == \
        f"{FALLBACK_AUTHOR[0]} <{FALLBACK_AUTHOR[1]}>|weekly-retrain test: dvc.lock"
    with pytest.raises(GitError, match="branch 'retrain/b' already exists"):
        propose_pipeline_state(checkout, "retrain/b", "again")
    # a deleted report is recorded as deleted (against HEAD, which still has none of these: all are new)
    _git(checkout, "add", "dvc.lock", "reports", "data/.gitignore")  # (as if the proposal had been merged)
    _git(checkout, "-c", "user.name=u", "-c", "user.email=u@u", "commit", "-q", "-m", "merged", "--",
         "dvc.lock", "reports", "data/.gitignore")
    (checkout / "reports" / "summary.md").unlink()
    commit2 = propose_pipeline_state(checkout, "retrain/c", "removed")
    assert _git(checkout, "show", "--name-status", "--format=", commit2).split() == ["D", "reports/summary.md"]


def test_a_configured_identity_is_used(checkout):
    _git(checkout, "config", "user.name", "Ada")
    _git(checkout, "config", "user.email", "ada@example.org")
    (checkout / "dvc.lock").write_text("schema: '2.0'\n")
    commit = propose_pipeline_state(checkout, "retrain/x", "m")
    assert _git(checkout, "log", "-1", "--format=%an <%ae>", commit).strip() == "Ada <ada@example.org>"


def test_git_remote_and_work_tree_are_checked_by_name(checkout, tmp_path):
    assert resolve_git_remote(checkout, None) is None
    with pytest.raises(GitError, match=r"git remote 'origin' is not configured in .*repo; configured remotes: none"):
        resolve_git_remote(checkout, "origin")
    _git(checkout, "remote", "add", "origin", str(tmp_path / "elsewhere.git"))
    assert resolve_git_remote(checkout, "origin") == "origin"
    plain = tmp_path / "plain"
    plain.mkdir()
    with pytest.raises(GitError, match=r"plain is not a git work tree"):
        resolve_git_remote(plain, None)
