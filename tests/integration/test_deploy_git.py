"""weekly-retrain's git side (trinity.ops.git_checkout): the work tree and git remote checked by name, and the commit
that records what the pipeline pushed — dvc.lock, reports/, DVC's .gitignore entries — and nothing else, proposed on a
branch of its own: the checkout's branch, index and work tree untouched. Before that, the checkout is brought to the
branch it follows (fetch, then a fast-forward only: real repositories, a bare `origin` and a colleague's clone), and
`dvc status` says whether anything changed."""
from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

from trinity.ops.git_checkout import FALLBACK_AUTHOR, GitError, propose_pipeline_state, resolve_git_remote


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


# ---------------------------------------------------------------- weekly-retrain follows a branch: fetch, fast-forward

from trinity.ops.git_checkout import check_follow, fast_forward, pipeline_changes, resolve_follow  # noqa: E402

ID = ("-c", "user.name=u", "-c", "user.email=u@u")


@pytest.fixture
def followed(tmp_path, monkeypatch):
    """A bare `origin`, the scheduler's checkout (a clone: main tracks origin/main), and a colleague's clone that
    pushes to origin."""
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    monkeypatch.setenv("GIT_CONFIG_NOSYSTEM", "1")
    origin, seed = tmp_path / "origin.git", tmp_path / "seed"
    _git(tmp_path, "init", "-q", "--bare", "-b", "main", str(origin))
    _git(tmp_path, "init", "-q", "-b", "main", str(seed))
    (seed / "dvc.yaml").write_text("stages: {}\n")
    (seed / "src.py").write_text("x = 1\n")
    _git(seed, "add", "-A")
    _git(seed, *ID, "commit", "-q", "-m", "init")
    _git(seed, "push", "-q", str(origin), "main")
    checkout, colleague = tmp_path / "checkout", tmp_path / "colleague"
    _git(tmp_path, "clone", "-q", str(origin), str(checkout))
    _git(tmp_path, "clone", "-q", str(origin), str(colleague))
    return checkout, colleague


def _push_change(clone: Path, files: dict[str, str], message: str = "upstream change") -> str:
    for name, text in files.items():
        (clone / name).parent.mkdir(parents=True, exist_ok=True)
        (clone / name).write_text(text)
    _git(clone, "add", "-A")
    _git(clone, *ID, "commit", "-q", "-m", message)
    _git(clone, "push", "-q", "origin", "HEAD:main")
    return _git(clone, "rev-parse", "HEAD").strip()


def test_fast_forward_brings_the_checkout_to_the_branch_it_follows(followed):
    checkout, colleague = followed
    start = _git(checkout, "rev-parse", "HEAD").strip()
    same = fast_forward(checkout)
    assert not same.moved and same.after == start and "main is at origin/main" in same.message()
    (checkout / "scratch.txt").write_text("the operator's note\n")  # untracked, untouched upstream: left alone
    (checkout / "src.py").write_text("x = 2  # a local edit the incoming commits do not touch\n")
    new = _push_change(colleague, {"params.yaml": "evolve: {generations: 5}\n"})
    ff = fast_forward(checkout)
    assert ff.moved and ff.before == start and ff.after == new == _git(checkout, "rev-parse", "HEAD").strip()
    assert f"fast-forwarded main {start[:12]} -> {new[:12]} (origin/main)" == ff.message()
    assert (checkout / "params.yaml").read_text() == "evolve: {generations: 5}\n"
    assert (checkout / "scratch.txt").exists() and (checkout / "src.py").read_text().startswith("x = 2")
    assert _git(checkout, "log", "--merges", "--format=%H").strip() == ""  # no merge commit, ever
    assert _git(checkout, "branch", "--show-current").strip() == "main"
    # an explicit follow: another branch of the remote
    _git(colleague, "push", "-q", "origin", "HEAD:release")
    newer = _push_change(colleague, {"src.py": "x = 3\n"}, "on main only")
    assert resolve_follow(checkout, "origin/release") == ("main", "origin", "release")
    assert not fast_forward(checkout, "origin/release").moved  # release is where main already is
    with pytest.raises(GitError, match=r"local changes to \['src.py'\] would be overwritten"):
        fast_forward(checkout)  # main moved on src.py, which the operator edited: named, nothing touched
    assert _git(checkout, "rev-parse", "HEAD").strip() == new
    assert (checkout / "src.py").read_text().startswith("x = 2")
    _git(checkout, "checkout", "--", "src.py")
    assert fast_forward(checkout).after == newer


def test_a_diverged_checkout_is_refused_never_merged(followed):
    checkout, colleague = followed
    (checkout / "local.py").write_text("y = 1\n")
    _git(checkout, "add", "local.py")
    _git(checkout, *ID, "commit", "-q", "-m", "a commit only this checkout has")
    mine = _git(checkout, "rev-parse", "HEAD").strip()
    with pytest.raises(GitError, match=r"cannot fast-forward 'main' .* it has 1 commit\(s\) that origin/main does "
                                       r"not \(0 the other way\)\. weekly-retrain only fast-forwards"):
        fast_forward(checkout)  # ahead: its commit would be trained on, unreviewed
    _push_change(colleague, {"params.yaml": "a: 1\n"})
    with pytest.raises(GitError, match=r"1 commit\(s\) that origin/main does not \(1 the other way\).*"
                                       r"git log origin/main\.\.main"):
        fast_forward(checkout)
    assert _git(checkout, "rev-parse", "HEAD").strip() == mine and not (checkout / "params.yaml").exists()


def test_a_merged_proposal_fast_forwards_over_the_same_pipeline_state(followed):
    """What a retrain leaves in the work tree (dvc.lock, reports/) and proposes on its branch comes back, merged,
    with the next fetch: identical, so the fast-forward sets the local copy back and brings it; different, it is a
    conflict a person must settle, named."""
    checkout, colleague = followed
    lock, report = "schema: '2.0'\nstages: {a: {}}\n", "# retrained\n"
    (checkout / "dvc.lock").write_text(lock)
    (checkout / "reports").mkdir()
    (checkout / "reports" / "summary.md").write_text(report)
    merged = _push_change(colleague, {"dvc.lock": lock, "reports/summary.md": report}, "merge retrain/x")
    ff = fast_forward(checkout)
    assert ff.after == merged and sorted(ff.restored) == ["dvc.lock", "reports/summary.md"]
    assert (checkout / "dvc.lock").read_text() == lock and _git(checkout, "status", "--porcelain").strip() == ""
    (checkout / "dvc.lock").write_text("schema: '2.0'\nstages: {b: {}}\n")  # this checkout's newer retrain ...
    _push_change(colleague, {"dvc.lock": "schema: '2.0'\nstages: {c: {}}\n"})  # ... and another one merged upstream
    with pytest.raises(GitError, match=r"local changes to \['dvc.lock'\] would be overwritten"):
        fast_forward(checkout)
    assert "stages: {b: {}}" in (checkout / "dvc.lock").read_text()


def test_the_branch_followed_is_checked_by_name(followed, tmp_path):
    checkout, colleague = followed
    assert resolve_follow(checkout, None) == ("main", "origin", "main")
    assert check_follow(checkout, None) == "origin/main"
    with pytest.raises(GitError, match=r"follow='nowhere/main' is not '<remote>/<branch>' with a remote configured "
                                       r"in .*checkout \(configured remotes: \['origin'\]\)"):
        resolve_follow(checkout, "nowhere/main")
    with pytest.raises(GitError, match=r"git remote 'origin' has no branch 'nope' for the checkout's branch 'main'"):
        check_follow(checkout, "origin/nope")
    _git(checkout, "switch", "-q", "-c", "lonely")
    with pytest.raises(GitError, match=r"branch 'lonely' in .* follows no remote branch \(it has no upstream\).*"
                                       r"--set-upstream-to <remote>/<branch>.*follow: <remote>/<branch>"):
        fast_forward(checkout)
    _git(checkout, "switch", "-q", "--detach", "main")
    with pytest.raises(GitError, match=r"is on a detached HEAD \([0-9a-f]+\)"):
        resolve_follow(checkout, None)
    _git(checkout, "switch", "-q", "main")
    _git(checkout, "remote", "set-url", "origin", str(tmp_path / "gone.git"))
    with pytest.raises(GitError, match=r"`git fetch --quiet --no-tags origin \+refs/heads/main:refs/remotes/origin/main`"
                                       r" failed in .*checkout \(exit 128\)"):
        fast_forward(checkout)


def test_pipeline_changes_is_dvc_status(tmp_path):
    """{} when the outputs match dvc.lock; the changed stage otherwise (its code, params or data)."""
    import sys

    repo = tmp_path / "p"
    repo.mkdir()
    _git(repo, "init", "-q")
    env = {**os.environ, "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}"}
    subprocess.run([sys.executable, "-m", "dvc", "init", "-q"], cwd=repo, check=True, env=env)
    (repo / "params.yaml").write_text("n: 1\n")
    (repo / "in.txt").write_text("data\n")
    (repo / "dvc.yaml").write_text("stages:\n  s:\n    cmd: cp in.txt out.txt\n    deps: [in.txt]\n"
                                   "    params: [n]\n    outs: [out.txt]\n")
    assert "s" in pipeline_changes(repo, env)  # never run
    subprocess.run([sys.executable, "-m", "dvc", "repro", "-q"], cwd=repo, check=True, env=env, capture_output=True)
    assert pipeline_changes(repo, env) == {}
    (repo / "params.yaml").write_text("n: 2\n")
    assert "s" in pipeline_changes(repo, env)
    (repo / "dvc.yaml").write_text("stages: [\n")
    with pytest.raises(RuntimeError, match=r"`dvc status --json` failed in .*p \(exit"):
        pipeline_changes(repo, env)
