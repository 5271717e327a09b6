"""Checks of prefect.yaml against the Prefect API, then `prefect deploy` (what `python flows/deploy.py` runs).

prefect.yaml declares the deployments (schedules, timezone, work pool, parameters) in one reviewed place; the
Prefect API is whatever the environment names (PREFECT_API_URL, plus PREFECT_API_KEY for Prefect Cloud).
Before anything is registered — and long before any model is called — every deployment is checked and every
problem is reported at once, each naming the file, the deployment and the key:

- the Prefect API: PREFECT_API_URL set (an ephemeral API would vanish with this process) and answering;
- schedules: each cron expression and timezone valid (Prefect's own validators);
- work pool: exists on that API;
- entrypoint: the file and the flow exist; parameters: valid for the flow's signature, the params file loads;
- DVC: a flow that pushes to a DVC remote (a `dvc_remote` parameter) finds that remote in the checkout, and can
  import its plugin (dvc-s3, dvc-gs, dvc-azure: the project's [s3], [gs], [azure] extras; trinity.ops.dvc_remote);
- git: a flow that pushes its commit to a git remote (a `git_remote` parameter) finds that remote too;
- git: a flow that follows a branch (a `follow` parameter: weekly-retrain) finds it — the checkout is on a branch,
  whose upstream (or `follow`, "<remote>/<branch>") names a configured remote that has that branch;
- nightly-eval's `items_per_benchmark`: enough items for the drop test to call a drop (trinity.ops.nightly);
- notifications: prefect.yaml's `trinity.notify` section is well formed, names declared deployments, each one in
  `on_missed` has a schedule to expect runs from, and its block exists (trinity.ops.alerts).

After `prefect deploy`, what keeps scheduled runs safe is set up on the same API: the checkout's global
concurrency limit (trinity.ops.checkout_lock: nightly-eval and weekly-retrain never overlap on one checkout; a run
of a deployment that finds it missing is refused) and the Automations of `trinity.notify` (a run of a deployment
in `on_failed` that ends Failed, Crashed or TimedOut notifies its block; so does a deployment in `on_missed` none
of whose runs finished in time).

Also here, weekly-retrain's git side: `fast_forward` brings the checkout to the branch it follows (`git fetch`,
then a fast-forward only: never a merge, never a dropped commit; a checkout that cannot fast-forward is refused,
naming why), `pipeline_changes` asks `dvc status` whether data, params or code changed since the outputs were
made, and `propose_pipeline_state` records what the run pushed (dvc.lock is the only pointer to the pushed
outputs: without it in git, nobody else can `dvc pull` them), committed on a branch of its own for review: the
checkout's branch, index and work tree are left as they are.
"""
from __future__ import annotations

import os
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from trinity.ops.dvc_remote import DvcRemoteError, resolve_dvc_remote


class DeploymentConfigError(ValueError):
    """prefect.yaml, or what it refers to, is not deployable; the message lists every problem."""


class GitError(ValueError):
    """The checkout is not a git repository, a git remote is not configured, or a git command failed."""


def load_prefect_doc(path: Path) -> dict[str, Any]:
    try:
        doc = yaml.safe_load(Path(path).read_text())
    except FileNotFoundError:
        raise DeploymentConfigError(f"{path}: file not found") from None
    except yaml.YAMLError as e:
        raise DeploymentConfigError(f"{path}: not valid YAML: {e}") from None
    return doc if isinstance(doc, dict) else {}


def load_prefect_file(path: Path) -> list[dict[str, Any]]:
    deployments = load_prefect_doc(path).get("deployments")
    if not isinstance(deployments, list) or not deployments:
        raise DeploymentConfigError(f"{path}: no `deployments:` list")
    return deployments


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


def _schedule_problems(where: str, schedules: Any) -> list[str]:
    from prefect.client.schemas.schedules import CronSchedule

    if schedules is None:
        return []
    if not isinstance(schedules, list):
        return [f"{where}.schedules: expected a list of schedules"]
    problems = []
    for i, sched in enumerate(schedules):
        if not isinstance(sched, dict):
            problems.append(f"{where}.schedules[{i}]: expected a mapping (cron, timezone, ...)")
            continue
        if "cron" in sched:
            try:
                CronSchedule(cron=sched["cron"], timezone=sched.get("timezone"))
            except ValueError as e:
                msgs = "; ".join(err["msg"].removeprefix("Value error, ") for err in e.errors()) \
                    if hasattr(e, "errors") else str(e)
                problems.append(f"{where}.schedules[{i}]: cron {sched['cron']!r}, timezone "
                                f"{sched.get('timezone')!r}: {msgs}")
    return problems


def _api_url() -> str | None:
    from prefect.settings import get_current_settings

    return get_current_settings().api.url


def check_api() -> str:
    """The Prefect API URL, checked to answer; raises DeploymentConfigError otherwise."""
    from prefect.client.orchestration import get_client

    url = _api_url()
    if not url:
        raise DeploymentConfigError(
            "PREFECT_API_URL is not set: deployments need a Prefect server that outlives this command. Start one "
            "(`prefect server start`) and `export PREFECT_API_URL=http://127.0.0.1:4200/api`, or log in to Prefect "
            "Cloud (PREFECT_API_URL and PREFECT_API_KEY)")
    with get_client(sync_client=True) as client:
        err = client.api_healthcheck()
    if err is not None:
        raise DeploymentConfigError(f"the Prefect API at {url} (PREFECT_API_URL) is unreachable: "
                                    f"{type(err).__name__}: {err}")
    return url


def check_deployments(root: Path, prefect_file: Path, names: list[str] | None = None) -> list[dict]:
    """Every check in the module docstring; returns the deployments to register, raises DeploymentConfigError
    listing every problem found."""
    from prefect.client.orchestration import get_client
    from prefect.exceptions import ObjectNotFound
    from prefect.flows import load_flow_from_entrypoint

    from trinity.ops.alerts import NotifyConfigError, missed_window, notification_block_id, notify_settings

    root, prefect_file = Path(root), Path(prefect_file)
    url = check_api()
    deployments = load_prefect_file(prefect_file)
    problems: list[str] = []
    try:
        notify = notify_settings(load_prefect_doc(prefect_file), str(prefect_file))
        declared = {d.get("name"): d for d in deployments}
        for key in ("on_failed", "on_missed"):
            unknown = [n for n in getattr(notify, key) if n not in declared]
            if unknown:
                problems.append(f"{prefect_file}: trinity.notify.{key}: no deployment named {unknown}")
    except NotifyConfigError as e:
        notify = None
        problems.append(str(e))
    known = [d.get("name") for d in deployments]
    if names:
        unknown = [n for n in names if n not in known]
        if unknown:
            raise DeploymentConfigError(f"{prefect_file}: no deployment named {unknown} (declared: {known})")
        deployments = [d for d in deployments if d.get("name") in names]
    with get_client(sync_client=True) as client:
        if notify is not None and notify.block:
            try:
                notification_block_id(client, notify)
            except NotifyConfigError as e:
                problems.append(f"{prefect_file}: {e}")
        for i, dep in enumerate(deployments):
            where = f"{prefect_file}: deployments[{dep.get('name') or i}]"
            if not dep.get("name"):
                problems.append(f"{where}.name: missing")
            schedule_problems = _schedule_problems(where, dep.get("schedules"))
            problems += schedule_problems
            if notify is not None and dep.get("name") in notify.on_missed and not schedule_problems:
                try:
                    missed_window(notify, dep, where)
                except NotifyConfigError as e:
                    problems.append(f"{e} (trinity.notify.on_missed)")
            pool = (dep.get("work_pool") or {}).get("name")
            if not pool:
                problems.append(f"{where}.work_pool.name: missing")
            else:
                try:
                    client.read_work_pool(pool)
                except ObjectNotFound:
                    problems.append(f"{where}.work_pool.name: work pool {pool!r} does not exist on {url} "
                                    f"(create it: prefect work-pool create {pool} --type process)")
            entrypoint = dep.get("entrypoint") or ""
            file, _, fn = entrypoint.partition(":")
            if not fn or not (root / file).is_file():
                problems.append(f"{where}.entrypoint: {entrypoint!r} is not <file under {root}>:<flow function>")
                continue
            try:
                flow = load_flow_from_entrypoint(str(root / entrypoint))
            except Exception as e:  # noqa: BLE001 — any import error is reported with its deployment
                problems.append(f"{where}.entrypoint: {entrypoint!r} does not load: {type(e).__name__}: {e}")
                continue
            parameters = dep.get("parameters") or {}
            try:
                flow.validate_parameters(parameters)
            except Exception as e:  # noqa: BLE001 — prefect's ParameterTypeError and friends
                problems.append(f"{where}.parameters: {e}")
                continue
            problems += _parameter_problems(root, where, flow, parameters)
    if problems:
        raise DeploymentConfigError(f"{len(problems)} problem(s) in the deployments:\n"
                                    + "\n".join(f"  - {p}" for p in problems))
    return deployments


def _parameter_problems(root: Path, where: str, flow, parameters: dict) -> list[str]:
    """What the flow would only find out when it runs: its params file, its DVC remote, its drop threshold."""
    import inspect

    from trinity.config import load_settings

    sig = inspect.signature(flow.fn)
    args = {k: p.default for k, p in sig.parameters.items() if p.default is not inspect.Parameter.empty}
    args |= parameters
    problems = []
    if "params" in args:
        params = Path(args["params"])
        try:
            load_settings(params if params.is_absolute() else root / params)
        except ValueError as e:
            problems.append(f"{where}.parameters.params: {e}")
    if "dvc_remote" in args:
        try:
            resolve_dvc_remote(root, args["dvc_remote"])
        except DvcRemoteError as e:
            problems.append(f"{where}.parameters.dvc_remote: {e}")
    if "git_remote" in args:
        try:
            resolve_git_remote(root, args["git_remote"])
        except GitError as e:
            problems.append(f"{where}.parameters.git_remote: {e}")
    if "follow" in args:
        try:
            check_follow(root, args["follow"])
        except GitError as e:
            problems.append(f"{where}.parameters.follow: {e}")
    if "drop_threshold" in args:
        from trinity.ops.nightly import check_threshold

        try:
            check_threshold(args["drop_threshold"])
        except ValueError as e:
            problems.append(f"{where}.parameters.drop_threshold: {e}")
    if "items_per_benchmark" in args:
        from trinity.ops.nightly import check_items_per_benchmark

        try:
            check_items_per_benchmark(args["items_per_benchmark"])
        except ValueError as e:
            problems.append(f"{where}.parameters.items_per_benchmark: {e}")
    return problems


def deploy(root: Path, prefect_file: Path, names: list[str] | None = None, env: dict | None = None) -> None:
    """Check, then register the deployments with `prefect deploy` run in the checkout (so a process worker's
    pull step sets its working directory to this checkout). Its output goes to the terminal."""
    from prefect.settings import get_current_settings

    deployments = check_deployments(root, prefect_file, names)
    cmd = [sys.executable, "-m", "prefect", "--no-prompt", "deploy", "--prefect-file", str(prefect_file)]
    for d in deployments:
        cmd += ["--name", d["name"]]
    url = _api_url()
    print(f"[deploy] {len(deployments)} deployment(s) checked against {url}: "
          f"{', '.join(d['name'] for d in deployments)}", flush=True)
    env = dict(env if env is not None else os.environ)
    env["PREFECT_API_URL"] = url  # the API just checked, whichever profile or variable named it
    key = get_current_settings().api.key
    if key is not None:
        env["PREFECT_API_KEY"] = key.get_secret_value()
    r = subprocess.run(cmd, cwd=root, env=env)
    if r.returncode != 0:
        raise DeploymentConfigError(f"`{' '.join(cmd[2:])}` failed (exit {r.returncode}); its output is above")
    safeguard(root, prefect_file, deployments)


def safeguard(root: Path, prefect_file: Path, deployments: list[dict]) -> None:
    """What keeps the registered deployments safe (module doc): the checkout's concurrency limit, and the
    automations of `trinity.notify` (replaced on every deploy; those it no longer asks for are deleted)."""
    from dataclasses import replace

    from prefect.client.orchestration import get_client

    from trinity.ops.alerts import ensure_automations, notify_settings, remove_stale_automations
    from trinity.ops.checkout_lock import ensure_checkout_limit

    notify = notify_settings(load_prefect_doc(prefect_file), str(prefect_file))
    with get_client(sync_client=True) as client:
        limit = ensure_checkout_limit(client, root)
        print(f"[deploy] checkout concurrency limit {limit!r} (1 slot): nightly-eval and weekly-retrain never "
              f"overlap on {Path(root).resolve()}", flush=True)
        wanted = {d["name"]: d.get("entrypoint") for d in deployments}
        registered = {d.name: d.id for d in client.read_deployments()
                      if d.name in wanted and d.entrypoint == wanted[d.name]}
        notify = replace(notify, on_failed=[n for n in notify.on_failed if n in wanted],
                         on_missed=[n for n in notify.on_missed if n in wanted])
        if not notify.enabled:
            removed = remove_stale_automations(client, registered)
            print("[deploy] no notification: prefect.yaml's trinity.notify names no block or webhook_url, or none of "
                  "these deployments (a failed or missing run notifies nobody)"
                  + (f"; removed the automations of an earlier deploy: {', '.join(removed)}" if removed else ""),
                  flush=True)
            return
        made = ensure_automations(client, notify, registered, {d["name"]: d for d in deployments},
                                  str(prefect_file))
        print(f"[deploy] automations: {', '.join(made)} (a run that ends Failed, Crashed or TimedOut, or no run "
              f"finished in time, notifies {notify.block or notify.webhook_url})", flush=True)
