"""weekly-retrain's git side: the checks of its git remote and of the branch it follows, and what it does in git.

`resolve_git_remote` checks that the checkout is a git work tree and that a named remote is configured there;
`resolve_follow` and `check_follow` find the branch the checkout follows (its upstream, or `follow`,
"<remote>/<branch>") and check that the remote has it (trinity.ops.deploy runs these checks before deploying).

`fast_forward` brings the checkout to the branch it follows (`git fetch`, then a fast-forward only: never a merge,
never a dropped commit; a checkout that cannot fast-forward is refused, naming why), `pipeline_changes` asks
`dvc status` whether data, params or code changed since the outputs were made, and `propose_pipeline_state`
records what the run pushed (dvc.lock is the only pointer to the pushed outputs: without it in git, nobody else
can `dvc pull` them), committed on a branch of its own for review: the checkout's branch, index and work tree are
left as they are.
"""
from __future__ import annotations

import os
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path


class GitError(ValueError):
    """The checkout is not a git repository, a git remote is not configured, or a git command failed."""


def _git(root: Path, *args: str, check: bool = True, env: dict | None = None) -> subprocess.CompletedProcess:
    r = subprocess.run(["git", *args], cwd=root, capture_output=True, text=True, env=env)
    if check and r.returncode != 0:
        raise GitError(f"`git {' '.join(args)}` failed in {root} (exit {r.returncode}): "
                       f"{(r.stderr or r.stdout).strip()}")
    return r


def resolve_git_remote(root: Path, remote: str | None) -> str | None:
    """Check that root is a git work tree and, when `remote` is given, that the remote is configured there;
    raises GitError naming what is missing and where."""
    if _git(root, "rev-parse", "--is-inside-work-tree", check=False).returncode != 0:
        raise GitError(f"{root} is not a git work tree: weekly-retrain records the dvc.lock of what it pushed in a "
                       "git commit (`git init`, or run it in a clone)")
    if remote is None:
        return None
    if _git(root, "remote", "get-url", remote, check=False).returncode != 0:
        remotes = _git(root, "remote").stdout.split()
        raise GitError(f"git remote {remote!r} is not configured in {root}; configured remotes: {remotes or 'none'}")
    return remote


# What a pipeline run changes in git: the lock file that names every output by hash, the reports (in git), evolve's
# fitness history (in git for `dvc plots show`: dvc.yaml, cache: false), and the .gitignore entries DVC writes for
# new outputs.
PIPELINE_STATE_PATHS = ("dvc.lock", "reports", "data/evolve/history.json", ":(glob)**/.gitignore")
FALLBACK_AUTHOR = ("trinity-weekly-retrain", "trinity-weekly-retrain@localhost")


def propose_pipeline_state(root: Path, branch: str, message: str) -> str | None:
    """Commit what the pipeline changed in git (PIPELINE_STATE_PATHS), and nothing else, on a new branch `branch`
    from HEAD, for review: the current branch, the index and the work tree are not touched (the commit is built
    in an index of its own). Returns the commit, or None when nothing changed (HEAD already names these outputs).
    A checkout without a git identity commits as FALLBACK_AUTHOR. An existing `branch` is a GitError."""
    import tempfile

    status = _git(root, "status", "--porcelain", "-z", "--untracked-files=all", "--", *PIPELINE_STATE_PATHS).stdout
    changed = [entry[3:] for entry in status.split("\0") if len(entry) > 3]
    if not changed:
        return None
    if _git(root, "rev-parse", "--verify", "--quiet", f"refs/heads/{branch}", check=False).returncode == 0:
        raise GitError(f"branch {branch!r} already exists in {root}: weekly-retrain proposes each run on a new branch")
    env = dict(os.environ)
    if not _git(root, "config", "user.email", check=False).stdout.strip():
        env.update(GIT_AUTHOR_NAME=FALLBACK_AUTHOR[0], GIT_AUTHOR_EMAIL=FALLBACK_AUTHOR[1],
                   GIT_COMMITTER_NAME=FALLBACK_AUTHOR[0], GIT_COMMITTER_EMAIL=FALLBACK_AUTHOR[1])
    with tempfile.TemporaryDirectory(prefix="trinity-proposal-") as tmp:
        index = {**env, "GIT_INDEX_FILE": str(Path(tmp) / "index")}
        _git(root, "read-tree", "HEAD", env=index)
        _git(root, "add", "-A", "--", *changed, env=index)
        tree = _git(root, "write-tree", env=index).stdout.strip()
    commit = _git(root, "commit-tree", tree, "-p", "HEAD", "-m", message, env=env).stdout.strip()
    _git(root, "branch", branch, commit)
    return commit


def _status_paths(root: Path) -> set[str]:
    """Every path with a local change in the checkout: modified, staged, deleted, renamed (both names), untracked."""
    out = _git(root, "status", "--porcelain", "-z", "--untracked-files=all").stdout.split("\0")
    paths, i = set(), 0
    while i < len(out):
        entry = out[i]
        i += 1
        if len(entry) < 4:
            continue
        paths.add(entry[3:])
        if entry[0] in "RC":  # a rename or copy: the next field is the original path
            paths.add(out[i])
            i += 1
    return paths


def is_pipeline_state(path: str) -> bool:
    """One of PIPELINE_STATE_PATHS: what the pipeline (not a person) changes in git."""
    return (path in ("dvc.lock", "data/evolve/history.json", ".gitignore") or path.startswith("reports/")
            or path.endswith("/.gitignore"))


def resolve_follow(root: Path, follow: str | None) -> tuple[str, str, str]:
    """(local branch, remote, remote branch) that weekly-retrain brings the checkout to: `follow`
    ("<remote>/<branch>"), else the upstream of the checkout's current branch. GitError, naming what is missing
    and how to set it, when the checkout is on no branch, follows nothing, or names a remote that does not exist."""
    root = Path(root)
    resolve_git_remote(root, None)  # a work tree at all
    head = _git(root, "symbolic-ref", "--quiet", "--short", "HEAD", check=False)
    if head.returncode != 0:
        sha = _git(root, "rev-parse", "--short", "HEAD", check=False).stdout.strip() or "no commit"
        raise GitError(f"{root} is on a detached HEAD ({sha}): weekly-retrain fast-forwards the checkout's branch to "
                       "the branch it follows; check that branch out (`git switch main`)")
    branch = head.stdout.strip()
    remotes = _git(root, "remote").stdout.split()
    if follow is None:
        remote = _git(root, "config", f"branch.{branch}.remote", check=False).stdout.strip()
        merge = _git(root, "config", f"branch.{branch}.merge", check=False).stdout.strip()
        if not remote or not merge:
            raise GitError(f"the checkout's branch {branch!r} in {root} follows no remote branch (it has no upstream), "
                           "so weekly-retrain has nothing to bring it to: `git branch --set-upstream-to "
                           f"<remote>/<branch>` (remotes: {remotes or 'none'}), or name the branch to follow: "
                           "weekly-retrain's parameter follow: <remote>/<branch> in prefect.yaml (--follow by hand)")
        if remote == "." or remote not in remotes:
            raise GitError(f"the checkout's branch {branch!r} in {root} follows {remote}/{merge} "
                           f"({'a local branch' if remote == '.' else 'a remote that is not configured'}): "
                           f"weekly-retrain follows a branch of a configured remote ({remotes or 'none'}); "
                           "`git branch --set-upstream-to <remote>/<branch>`, or set the parameter follow")
        return branch, remote, merge.removeprefix("refs/heads/")
    if not isinstance(follow, str):
        raise GitError(f"follow must be '<remote>/<branch>' (e.g. origin/main) or null, got {follow!r}")
    matches = sorted((r for r in remotes if follow.startswith(r + "/") and len(follow) > len(r) + 1), key=len)
    if not matches:
        raise GitError(f"follow={follow!r} is not '<remote>/<branch>' with a remote configured in {root} "
                       f"(configured remotes: {remotes or 'none'})")
    remote = matches[-1]
    return branch, remote, follow[len(remote) + 1:]


def check_follow(root: Path, follow: str | None, timeout_s: float = 60.0) -> str:
    """`resolve_follow`, and the remote has that branch (`git ls-remote`); returns "<remote>/<branch>"."""
    branch, remote, rbranch = resolve_follow(root, follow)
    try:
        r = subprocess.run(["git", "ls-remote", "--exit-code", "--heads", remote, f"refs/heads/{rbranch}"], cwd=root,
                           capture_output=True, text=True, timeout=timeout_s)
    except subprocess.TimeoutExpired:
        raise GitError(f"git remote {remote!r} did not answer within {timeout_s:.0f} s (`git ls-remote {remote}` "
                       f"in {root})") from None
    if r.returncode == 2:
        raise GitError(f"git remote {remote!r} has no branch {rbranch!r} for the checkout's branch {branch!r} to "
                       f"follow (`git ls-remote --heads {remote}` in {root})")
    if r.returncode != 0:
        raise GitError(f"`git ls-remote --heads {remote}` failed in {root} (exit {r.returncode}): "
                       f"{(r.stderr or r.stdout).strip()}")
    return f"{remote}/{rbranch}"


@dataclass(frozen=True)
class FastForward:
    """What `fast_forward` did: the checkout's `branch` went from `before` to `after` (equal: it was already
    there), following `upstream`; `restored`: pipeline-state files whose local copy matched the incoming one."""

    branch: str
    upstream: str
    before: str
    after: str
    restored: tuple[str, ...] = ()

    @property
    def moved(self) -> bool:
        return self.before != self.after

    def message(self) -> str:
        if not self.moved:
            return f"{self.branch} is at {self.upstream} ({self.after[:12]}): nothing new"
        return f"fast-forwarded {self.branch} {self.before[:12]} -> {self.after[:12]} ({self.upstream})"


def fast_forward(root: Path, follow: str | None = None) -> FastForward:
    """Bring the checkout's branch to the branch it follows (`resolve_follow`): `git fetch` of that branch, then a
    fast-forward — never a merge, never a dropped commit. Refused (GitError, naming the commits or files and what
    to do) when the branch has commits the followed one does not, or when local changes would be overwritten.
    The one kind of local change it settles itself: pipeline state (dvc.lock, reports/, .gitignore; what an
    earlier retrain left in the work tree and proposed on its branch) identical to the incoming version — the
    proposal, merged upstream — is set back so the fast-forward can bring the same content."""
    root = Path(root)
    branch, remote, rbranch = resolve_follow(root, follow)
    upstream = f"{remote}/{rbranch}"
    tracking = f"refs/remotes/{remote}/{rbranch}"
    _git(root, "fetch", "--quiet", "--no-tags", remote, f"+refs/heads/{rbranch}:{tracking}")
    before = _git(root, "rev-parse", "HEAD").stdout.strip()
    target = _git(root, "rev-parse", tracking).stdout.strip()
    if before == target:
        return FastForward(branch, upstream, before, target)
    if _git(root, "merge-base", "--is-ancestor", "HEAD", tracking, check=False).returncode != 0:
        ahead = _git(root, "rev-list", "--count", f"{tracking}..HEAD").stdout.strip()
        behind = _git(root, "rev-list", "--count", f"HEAD..{tracking}").stdout.strip()
        raise GitError(f"cannot fast-forward {branch!r} in {root} to {upstream}: it has {ahead} commit(s) that "
                       f"{upstream} does not ({behind} the other way). weekly-retrain only fast-forwards (never merges "
                       f"or drops commits): push them to {upstream}, or move them to another branch and reset "
                       f"{branch!r} to {upstream} (`git log {upstream}..{branch}` lists them)")
    incoming = set(p for p in _git(root, "diff", "--name-only", "-z", "HEAD", tracking).stdout.split("\0") if p)
    blocking = sorted(incoming & _status_paths(root))
    restorable = [p for p in blocking if is_pipeline_state(p) and _same_as(root, p, target)]
    others = [p for p in blocking if p not in restorable]
    if others:
        raise GitError(f"cannot fast-forward {branch!r} in {root} to {upstream}: local changes to {others} would be "
                       f"overwritten (the incoming commits change them too); commit, stash or discard them there")
    in_head = set(_git(root, "ls-tree", "-r", "--name-only", "-z", "HEAD", "--", *restorable).stdout.split("\0")) \
        if restorable else set()
    for p in restorable:
        if p in in_head:
            _git(root, "checkout", "HEAD", "--", p)
        else:
            _git(root, "rm", "--cached", "--quiet", "--ignore-unmatch", "--", p)
            (root / p).unlink()
    _git(root, "merge", "--ff-only", "--quiet", tracking)
    after = _git(root, "rev-parse", "HEAD").stdout.strip()
    return FastForward(branch, upstream, before, after, tuple(restorable))


def _same_as(root: Path, path: str, commit: str) -> bool:
    """Whether the work tree's `path` has the content `commit` has there (both absent counts as the same)."""
    blob = _git(root, "rev-parse", "--verify", "--quiet", f"{commit}:{path}", check=False).stdout.strip()
    local = Path(root) / path
    if not local.is_file():
        return not blob
    return bool(blob) and _git(root, "hash-object", "--", path).stdout.strip() == blob


def pipeline_changes(root: Path, env: dict | None = None) -> dict:
    """`dvc status --json` in the checkout: {} when every stage's deps, params and outs match dvc.lock (nothing to
    retrain), else what changed, stage by stage. RuntimeError with DVC's output when it fails."""
    import json

    r = subprocess.run([sys.executable, "-m", "dvc", "status", "--json"], cwd=root, capture_output=True, text=True,
                       env=env)
    if r.returncode != 0:
        raise RuntimeError(f"`dvc status --json` failed in {root} (exit {r.returncode}): "
                           f"{(r.stderr or r.stdout).strip()[-2000:]}")
    text = r.stdout.strip()
    start = text.find("{")
    try:
        return json.loads(text[start:]) if start >= 0 else {}
    except json.JSONDecodeError:
        raise RuntimeError(f"`dvc status --json` in {root} printed no JSON: {text[-2000:]!r}") from None
