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

weekly-retrain's git side (the git remote and followed-branch checks used here, `fast_forward`,
`pipeline_changes`, `propose_pipeline_state`) is in trinity.ops.git_checkout.
"""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import yaml

from trinity.ops.dvc_remote import DvcRemoteError, resolve_dvc_remote
from trinity.ops.git_checkout import GitError, check_follow, resolve_git_remote


class DeploymentConfigError(ValueError):
    """prefect.yaml, or what it refers to, is not deployable; the message lists every problem."""


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
