"""Prefect deployments for real: a `prefect server start` on 127.0.0.1 (own PREFECT_HOME), prefect.yaml checked
and registered (`python flows/deploy.py`), a process worker, and `nightly-eval` triggered by a run request on a
tiny configuration whose pool members are an OpenAI-compatible endpoint (tests/fake_openai_server.py, real HTTP).

Night 1 reaches Completed with its two artifacts; then the "provider" silently changes the model behind the
endpoint (right answers become wrong ones) and night 2 — which makes every call again, no stored reply — ends
Failed with the drop in its state message and its artifacts published, and the Automation created at deploy time
posts the failure to a webhook (a real HTTP receiver here); night 3 is compared with night 1, not with the flagged
night 2. Overlapping triggers are refused: a second nightly-eval while one runs (the deployment's concurrency
limit), and weekly-retrain while nightly-eval holds the checkout (its global concurrency limit). Every process the
test started (server, worker, the worker's flow-run processes) is gone afterwards, also when the test itself is
SIGKILLed (tests/process_supervisor.py). Bad input (a malformed cron, an unknown work pool, a missing DVC remote, an
unreachable API) is refused by name before anything is registered or any model called."""
from __future__ import annotations

import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import httpx
import pytest
import yaml

from trinity.config import PROJECT_ROOT, load_settings
from trinity.data.splits import save_tasks
from trinity.ops.nightly import (SCORES_ARTIFACT_KEY, SUMMARY_ARTIFACT_KEY, NightlyRecord, compare, history_path,
                             summary_markdown)
from trinity.records import Task

from fake_openai_server import FakeOpenAIServer
from process_supervisor import Supervisor, alive

ANSWER = {"value": "42"}
"""What the fake endpoint's models answer: every task's answer is 42, so '42' is right and anything else wrong."""

TRAIN = [Task(id=f"math500/t{i}", source="math500", prompt=(f"Compute {a} + {b}.",), grader="math", answer="42")
         for i, (a, b) in enumerate([(40, 2), (30, 12)])]
IN_DISTRIBUTION = [Task(id="math500/e1", source="math500", prompt=("Compute 21 * 2.",), grader="math", answer="42")]
HELDOUT = [Task(id=f"gsm8k/h{i}", source="gsm8k", prompt=(q,), grader="math", answer="42")
           for i, q in enumerate(["Tom has 50 apples and gives away 8. How many are left?",
                                  "A box holds 6 rows of 7 eggs. How many eggs?",
                                  "Ann reads 14 pages a day for 3 days. How many pages?",
                                  "A bus has 50 seats and 8 are empty. How many are taken?",
                                  "Six friends share 252 stickers equally. How many each?"])]
"""Five held-out items: the fewest on which the nightly drop test can call a paired drop (MIN_ITEMS_FOR_OUTCOME)."""


class WebhookReceiver:
    """A notification endpoint on 127.0.0.1: records the JSON body of every POST."""

    def __init__(self):
        import threading
        from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

        received = self.received = []

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self):
                body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
                received.append(json.loads(body or b"{}"))
                self.send_response(200)
                self.send_header("Content-Length", "0")
                self.end_headers()

            def log_message(self, *args):
                pass

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}/hook"
        threading.Thread(target=self.httpd.serve_forever, daemon=True).start()

    def wait_for(self, n: int, timeout: float = 120) -> list[dict]:
        deadline = time.monotonic() + timeout
        while len(self.received) < n and time.monotonic() < deadline:
            time.sleep(0.5)
        return self.received


def _tiny_params(base_url: str) -> dict:
    member = {"backend": "openai", "base_url": base_url, "max_tokens": 16, "timeout_s": 10.0, "max_retries": 1}
    return {
        "data": {"train": {"math500": 2}, "in_distribution": {"math500": 1}, "heldout": {"gsm8k": 2}},
        "pool": {"members": [{"name": "api-a", "model": "model-a", **member},
                             {"name": "api-b", "model": "model-b", **member}]},
        "coordinator": {"max_turns": 2, "thinker_max_tokens": 12, "verifier_max_tokens": 4, "max_encode_tokens": 384},
        "evolve": {"generations": 1, "popsize": 2, "episodes_per_candidate": 1},
        "evaluate": {"bootstrap_resamples": 100},
        "tracking": {"wandb_mode": "disabled"},
    }


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _sh(cmd, cwd, env, timeout=300, ok=True) -> subprocess.CompletedProcess:
    r = subprocess.run(cmd, cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout)
    if ok:
        assert r.returncode == 0, f"{cmd} failed ({r.returncode}):\n{r.stdout[-3000:]}\n{r.stderr[-3000:]}"
    return r


@pytest.fixture(scope="module")
def llm():
    with FakeOpenAIServer(reply=lambda messages: f"The answer is {ANSWER['value']}.") as srv:
        yield srv


@pytest.fixture(scope="module")
def project(tmp_path_factory, llm):
    """A checkout (flows/, src/, prefect.yaml) with a tiny params.yaml, its prepared splits, a coordinator
    trained on them by the evolve stage, and a DVC project with a default (local) remote."""
    from trinity.stages import paths as stage_paths, run_stage

    tmp = tmp_path_factory.mktemp("deployments")
    repo = tmp / "repo"
    repo.mkdir()
    for item in ("flows", "src", "prefect.yaml"):
        src = PROJECT_ROOT / item
        (shutil.copytree(src, repo / item, ignore=shutil.ignore_patterns("__pycache__", "*.egg-info"))
         if src.is_dir() else shutil.copy(src, repo / item))
    (repo / "params.yaml").write_text(yaml.safe_dump(_tiny_params(llm.base_url), sort_keys=False))
    paths = stage_paths.Paths(repo)
    for split, tasks in (("train", TRAIN), ("in_distribution", IN_DISTRIBUTION), ("heldout", HELDOUT),
                         ("validation", [])):
        save_tasks(paths.prepared / stage_paths.SPLIT_FILES[split], tasks)
    run_stage("evolve", load_settings(repo / "params.yaml"), paths)
    assert paths.checkpoint.with_suffix(".npy").exists()
    env = {**os.environ, "PATH": f"{Path(sys.executable).parent}:{os.environ['PATH']}",
           "GIT_AUTHOR_NAME": "t", "GIT_AUTHOR_EMAIL": "t@t", "GIT_COMMITTER_NAME": "t", "GIT_COMMITTER_EMAIL": "t@t"}
    _sh(["git", "init", "-q"], repo, env)
    _sh(["dvc", "init", "-q"], repo, env)
    _sh(["dvc", "remote", "add", "-d", "local", str(tmp / "dvc-remote")], repo, env)
    # the pipeline weekly-retrain reproduces here: one cheap stage that reads the checkpoint
    (repo / "dvc.yaml").write_text(yaml.safe_dump({"stages": {"checkpoint-summary": {
        "cmd": "python -c \"import json; m = json.load(open('data/checkpoints/coordinator.json')); "
               "json.dump({'n_params': m['n_params']}, open('data/checkpoint-summary.json', 'w'))\"",
        "deps": ["data/checkpoints/coordinator.json"], "outs": ["data/checkpoint-summary.json"]}}}))
    # committed, as a user's checkout is, with a git remote (a bare repository) weekly-retrain may push to
    (repo / ".gitignore").write_text("data/\n__pycache__/\n*.egg-info/\n")
    _sh(["git", "add", "-A"], repo, env)
    _sh(["git", "commit", "-q", "-m", "tiny project"], repo, env)
    _sh(["git", "init", "-q", "--bare", str(tmp / "origin.git")], repo, env)
    _sh(["git", "remote", "add", "origin", str(tmp / "origin.git")], repo, env)
    return repo


@pytest.fixture(scope="module")
def prefect(tmp_path_factory, project):
    """`prefect server start` on 127.0.0.1 with its own PREFECT_HOME, and the `trinity` process work pool; the
    supervisor that started it, and the environment that points the CLI at it."""
    tmp = tmp_path_factory.mktemp("prefect")
    port = _free_port()
    url = f"http://127.0.0.1:{port}/api"
    env = {**os.environ, "PATH": f"{Path(sys.executable).parent}:{os.environ['PATH']}",
           "PREFECT_HOME": str(tmp / "home"), "PREFECT_API_URL": url, "PREFECT_UI_ENABLED": "false",
           "PREFECT_SERVER_ANALYTICS_ENABLED": "false", "DO_NOT_TRACK": "1", "PREFECT_WORKER_QUERY_SECONDS": "2",
           "PREFECT_LOGGING_LEVEL": "INFO", "WANDB_MODE": "disabled", "PYTHONUNBUFFERED": "1"}
    env.pop("TRINITY_DATA_DIR", None)
    sup = Supervisor()
    try:
        sup.start("server", [sys.executable, "-m", "prefect", "server", "start", "--host", "127.0.0.1",
                             "--port", str(port)], env, str(tmp), str(tmp / "server.log"))
        deadline = time.monotonic() + 120
        while True:
            try:
                if httpx.get(f"{url}/health", timeout=2).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            assert time.monotonic() < deadline, (tmp / "server.log").read_text()[-3000:]
            time.sleep(0.5)
        _sh(["prefect", "work-pool", "create", "trinity", "--type", "process"], project, env)
        yield {"url": url, "env": env, "sup": sup, "logs": tmp}
    finally:
        sup.descendants()
        sup.stop()
        assert alive(sup.seen) == [], f"processes left behind: {alive(sup.seen)}"


def _deploy(project, env, *args) -> subprocess.CompletedProcess:
    return _sh([sys.executable, "flows/deploy.py", *args], project, env, ok=False, timeout=300)


def _wait_for_run(prefect, run_id: str, timeout: float = 420) -> dict:
    """Poll the API until the flow run is final; keeps a record of every process under the supervisor."""
    deadline = time.monotonic() + timeout
    while True:
        prefect["sup"].descendants()
        run = httpx.get(f"{prefect['url']}/flow_runs/{run_id}", timeout=10).json()
        if run["state"]["type"] in ("COMPLETED", "FAILED", "CRASHED", "CANCELLED"):
            return run
        if time.monotonic() > deadline:
            log = (prefect["logs"] / "worker.log").read_text()[-4000:]
            pytest.fail(f"flow run {run_id} still {run['state']['type']} after {timeout}s; worker log:\n{log}")
        time.sleep(1)


def _trigger(project, prefect, deployment="trinity-nightly-eval/nightly-eval", *params: str) -> str:
    r = _sh(["prefect", "deployment", "run", deployment, *[a for p in params for a in ("--param", p)]], project,
            prefect["env"])
    ids = re.findall(r"UUID: ([0-9a-f-]{36})", r.stdout)
    assert ids, r.stdout
    return ids[0]


def _artifacts(prefect, key: str) -> list[dict]:
    r = httpx.post(f"{prefect['url']}/artifacts/filter", timeout=10,
                   json={"artifacts": {"key": {"any_": [key]}}, "sort": "CREATED_DESC"})
    r.raise_for_status()
    return r.json()[::-1]  # oldest first


def test_bad_deployments_are_refused_by_name_before_anything_is_registered(project, prefect, llm, tmp_path):
    bad = yaml.safe_load((project / "prefect.yaml").read_text())
    nightly, retrain = bad["deployments"]
    nightly["schedules"][0]["cron"] = "61 2 * * *"
    nightly["schedules"].append({"cron": "0 2 * * *", "timezone": "Mars/Olympus"})
    nightly["work_pool"] = {"name": "no-such-pool"}
    retrain["parameters"]["dvc_remote"] = "no-such-remote"
    retrain["parameters"]["git_remote"] = "no-such-git-remote"
    bad_file = tmp_path / "prefect.yaml"
    bad_file.write_text(yaml.safe_dump(bad, sort_keys=False))
    calls = llm.request_count
    r = _deploy(project, prefect["env"], "--prefect-file", str(bad_file))
    assert r.returncode == 2, r.stdout + r.stderr
    err = r.stderr
    assert "deployments[nightly-eval].schedules[0]: cron '61 2 * * *'" in err and "Invalid cron string" in err
    assert "deployments[nightly-eval].schedules[1]" in err and "Invalid timezone" in err and "Mars/Olympus" in err
    assert "deployments[nightly-eval].work_pool.name: work pool 'no-such-pool' does not exist on " \
        + prefect["url"] in err
    assert "deployments[weekly-retrain].parameters.dvc_remote: DVC remote 'no-such-remote' is not configured in " \
        + str(project / ".dvc" / "config") in err
    assert "deployments[weekly-retrain].parameters.git_remote: git remote 'no-such-git-remote' is not configured in " \
        + f"{project}; configured remotes: ['origin']" in err
    assert "5 problem(s)" in err
    deployments = httpx.post(f"{prefect['url']}/deployments/filter", json={}, timeout=10).json()
    assert deployments == [] and llm.request_count == calls  # nothing registered, no model called

    # no Prefect API: named, with the variable that names it
    closed = f"http://127.0.0.1:{_free_port()}/api"
    r = _deploy(project, {**prefect["env"], "PREFECT_API_URL": closed})
    assert r.returncode == 2 and f"the Prefect API at {closed} (PREFECT_API_URL) is unreachable" in r.stderr, r.stderr
    r = _deploy(project, {k: v for k, v in prefect["env"].items() if k != "PREFECT_API_URL"})
    assert r.returncode == 2 and "PREFECT_API_URL is not set" in r.stderr, r.stderr
    # no default DVC remote for weekly-retrain
    remote_less = tmp_path / "remote-less"
    remote_less.mkdir()
    shutil.copy(project / "prefect.yaml", remote_less / "prefect.yaml")
    (remote_less / ".dvc").mkdir()
    (remote_less / ".dvc" / "config").write_text("")
    from trinity.ops.deploy import DvcRemoteError, resolve_dvc_remote

    with pytest.raises(DvcRemoteError, match=r"sets no default remote.*configured remotes: none"):
        resolve_dvc_remote(remote_less, None)
    assert resolve_dvc_remote(project, None) == "local"


@pytest.fixture(scope="module")
def webhook():
    receiver = WebhookReceiver()
    yield receiver
    receiver.httpd.shutdown()


def test_nightly_eval_deployment_runs_on_a_worker_then_flags_a_silent_model_change(project, prefect, llm, webhook):
    env = prefect["env"]
    doc = yaml.safe_load((project / "prefect.yaml").read_text())
    doc["trinity"]["notify"]["webhook_url"] = webhook.url  # as a user would: a Slack / Teams / any webhook
    (project / "prefect.yaml").write_text(yaml.safe_dump(doc, sort_keys=False))
    r = _deploy(project, env)
    assert r.returncode == 0, r.stdout + r.stderr
    assert "2 deployment(s) checked" in r.stdout
    assert "automations: trinity: nightly-eval failed" in r.stdout and "checkout concurrency limit" in r.stdout
    automations = httpx.post(f"{prefect['url']}/automations/filter", json={}, timeout=10).json()
    assert [a["name"] for a in automations] == ["trinity: nightly-eval failed"]
    assert automations[0]["trigger"]["expect"] == ["prefect.flow-run.Failed"]
    deployments = {d["name"]: d for d in httpx.post(f"{prefect['url']}/deployments/filter", json={},
                                                     timeout=10).json()}
    assert set(deployments) == {"nightly-eval", "weekly-retrain"}
    nightly = deployments["nightly-eval"]
    assert nightly["work_pool_name"] == "trinity" and nightly["parameters"]["drop_threshold"] == 0.05
    limit = nightly.get("global_concurrency_limit") or {}  # (the deployment's limit, as the API reports it)
    assert (nightly.get("concurrency_limit") or limit.get("limit")) == 1, nightly
    assert nightly["concurrency_options"]["collision_strategy"] == "CANCEL_NEW", nightly
    assert [(s["schedule"]["cron"], s["schedule"]["timezone"]) for s in nightly["schedules"]] == [("0 2 * * *", "UTC")]
    assert nightly["pull_steps"] == [{"prefect.deployments.steps.set_working_directory":
                                      {"directory": str(project)}}]
    prefect["sup"].start("worker", [sys.executable, "-m", "prefect", "worker", "start", "--pool", "trinity",
                                    "--type", "process", "--name", "test-worker"],
                         env, str(project), str(prefect["logs"] / "worker.log"))

    # night 1: the endpoint's models answer right
    ANSWER["value"] = "42"
    calls0 = llm.request_count
    first = _wait_for_run(prefect, _trigger(project, prefect))
    assert first["state"]["type"] == "COMPLETED", (first["state"], (prefect["logs"] / "worker.log").read_text()[-4000:])
    assert webhook.received == []  # a Completed night notifies nobody
    assert llm.request_count > calls0  # real calls to the endpoint, from the worker's flow-run process
    summary = _artifacts(prefect, SUMMARY_ARTIFACT_KEY)
    table = _artifacts(prefect, SCORES_ARTIFACT_KEY)
    assert [a["flow_run_id"] for a in summary] == [first["id"]] and summary[0]["type"] == "markdown"
    assert "OK — first nightly evaluation" in summary[0]["data"]
    rows = json.loads(table[0]["data"]) if isinstance(table[0]["data"], str) else table[0]["data"]
    assert table[0]["type"] == "table" and table[0]["flow_run_id"] == first["id"]
    by = {(row["method"], row["benchmark"]): row for row in rows}
    assert by[("alone:api-a", "gsm8k")]["score"] == 1.0 and by[("alone:api-a", "gsm8k")]["previous"] is None
    assert {b for _, b in by} == {"math500", "gsm8k"}
    history = [json.loads(line) for line in history_path(project).read_text().splitlines()]
    assert [h["run"] for h in history] == [first["name"]]

    # night 2: the provider swapped the model behind the endpoint; no stored reply may hide it
    ANSWER["value"] = "41"
    calls1 = llm.request_count
    second = _wait_for_run(prefect, _trigger(project, prefect))
    assert second["state"]["type"] == "FAILED", second["state"]
    msg = second["state"]["message"]
    assert f"score drop beyond 0.050 since {first['name']}" in msg and "alone:api-a on gsm8k 1.000 -> 0.000" in msg
    assert "(paired -1.000 [-1.000, -1.000], 5 items)" in msg
    assert "math500" not in msg  # one in-distribution item: too few to call a drop (listed, not flagged)
    (note,) = webhook.wait_for(1)  # the automation fired: the server posted the failure to the block's webhook
    assert note["subject"] == f"Trinity: nightly-eval run {second['name']} failed", note
    assert second["id"] in note["body"] and "score drop beyond 0.050" in note["body"], note
    assert llm.request_count > calls1  # every call made again
    summary = _artifacts(prefect, SUMMARY_ARTIFACT_KEY)
    assert [a["flow_run_id"] for a in summary] == [first["id"], second["id"]]  # the nightly history, one key
    assert "**DROP FLAGGED**" in summary[1]["data"] and "alone:api-b | gsm8k | heldout_other | 0.000 | 1.000 | -1.000 " \
        "**drop**" in summary[1]["data"]
    assert len(_artifacts(prefect, SCORES_ARTIFACT_KEY)) == 2
    # what the README tells a user to run
    shown = json.loads(_sh(["prefect", "artifact", "inspect", SUMMARY_ARTIFACT_KEY, "-o", "json"], project, env).stdout)
    assert [a["flow_run_id"] for a in shown] == [second["id"], first["id"]]  # newest first
    print(f"\n[deployments] nightly-eval runs: {first['name']} {first['id']} {first['state']['type']}; "
          f"{second['name']} {second['id']} {second['state']['type']}: {msg}; artifact keys "
          f"{SUMMARY_ARTIFACT_KEY}, {SCORES_ARTIFACT_KEY} (2 versions each)")
    task_runs = httpx.post(f"{prefect['url']}/task_runs/filter", timeout=10,
                           json={"flow_runs": {"id": {"any_": [second["id"]]}}}).json()
    assert {t["name"].rsplit("-", 1)[0] for t in task_runs} == {"check-inputs", "evaluate-checkpoint",
                                                                 "compare-with-previous", "publish-artifacts"}
    runs = sorted((project / "data" / "nightly" / "runs").iterdir())
    assert len(runs) == 2 and all((d / "results.json").exists() and (d / "store.duckdb").exists() for d in runs)
    # the flow-run processes were the worker's children, in sessions of their own: the supervisor saw them
    assert len(prefect["sup"].seen) >= 3

    # night 3, still broken: compared with night 1 (night 2 was flagged, so it never became the baseline)
    third = _wait_for_run(prefect, _trigger(project, prefect))
    assert third["state"]["type"] == "FAILED" and f"since {first['name']}" in third["state"]["message"], third["state"]
    history = [json.loads(line) for line in history_path(project).read_text().splitlines()]
    assert [(h["run"], h["flagged"]) for h in history] == [(first["name"], False), (second["name"], True),
                                                          (third["name"], True)]
    assert len(webhook.wait_for(2)) == 2 and third["name"] in webhook.received[1]["subject"]
    print(f"[deployments] automation 'trinity: nightly-eval failed' posted: {webhook.received[0]}")


def test_overlapping_runs_are_refused(project, prefect, llm):
    """While a nightly-eval runs: a second nightly-eval is Cancelled by the server (the deployment's concurrency
    limit), and weekly-retrain is refused by the checkout's global concurrency limit (Cancelled, naming it)."""
    from trinity.ops.checkout_lock import checkout_limit_name

    ANSWER["value"] = "42"
    llm.latency_s = 8.0  # a night long enough to overlap (below the members' 10 s timeout)
    try:
        running = _trigger(project, prefect)
        deadline = time.monotonic() + 120
        while httpx.get(f"{prefect['url']}/flow_runs/{running}", timeout=10).json()["state"]["type"] != "RUNNING":
            assert time.monotonic() < deadline, "the first nightly run never started"
            time.sleep(0.5)
        duplicate_id = _trigger(project, prefect)
        retrain_id = _trigger(project, prefect, "trinity-weekly-retrain/weekly-retrain", "dvc_remote=no-such-remote")
        duplicate, retrain = _wait_for_run(prefect, duplicate_id), _wait_for_run(prefect, retrain_id)
        first = _wait_for_run(prefect, running)
    finally:
        llm.latency_s = 0.0
    assert duplicate["state"]["type"] == "CANCELLED", duplicate["state"]
    assert "concurrency limit" in duplicate["state"]["message"], duplicate["state"]
    assert retrain["state"]["type"] == "CANCELLED", retrain["state"]
    assert "holds this checkout" in retrain["state"]["message"] \
        and checkout_limit_name(project) in retrain["state"]["message"], retrain["state"]
    assert first["state"]["type"] in ("COMPLETED", "FAILED") and first["start_time"] < retrain["end_time"]
    assert not (project / "dvc.lock").exists()  # the refused retrain ran nothing
    print(f"\n[deployments] overlapping: nightly {duplicate['name']} {duplicate['state']['type']} "
          f"({duplicate['state']['message']}); weekly-retrain {retrain['name']} {retrain['state']['type']} "
          f"({retrain['state']['message']})")


def test_weekly_retrain_checks_the_remote_first_then_reproduces_and_pushes(project, prefect, tmp_path):
    retrain = "trinity-weekly-retrain/weekly-retrain"
    bad = _wait_for_run(prefect, _trigger(project, prefect, retrain, "dvc_remote=no-such-remote"))
    assert bad["state"]["type"] == "FAILED" and "DVC remote 'no-such-remote' is not configured" in \
        bad["state"]["message"], bad["state"]
    assert not (project / "dvc.lock").exists()  # refused before the pipeline ran
    bad_git = _wait_for_run(prefect, _trigger(project, prefect, retrain, "git_remote=nowhere"))
    assert bad_git["state"]["type"] == "FAILED" and "git remote 'nowhere' is not configured" in \
        bad_git["state"]["message"] and "origin" in bad_git["state"]["message"], bad_git["state"]
    assert not (project / "dvc.lock").exists()
    main_before = _sh(["git", "rev-parse", "HEAD"], project, os.environ).stdout.strip()
    run = _wait_for_run(prefect, _trigger(project, prefect, retrain, "git_remote=origin"))
    assert run["state"]["type"] == "COMPLETED", (run["state"], (prefect["logs"] / "worker.log").read_text()[-4000:])
    assert json.loads((project / "data/checkpoint-summary.json").read_text())["n_params"] > 0
    assert "checkpoint-summary" in (project / "dvc.lock").read_text()
    # pushed: with the local copy and DVC's cache gone, the output comes back from the remote
    env = {**os.environ, "PATH": f"{Path(sys.executable).parent}:{os.environ['PATH']}"}
    (project / "data/checkpoint-summary.json").unlink()
    shutil.rmtree(project / ".dvc" / "cache")
    _sh(["dvc", "pull", "data/checkpoint-summary.json"], project, env)
    assert json.loads((project / "data/checkpoint-summary.json").read_text())["n_params"] > 0
    # dvc.lock, which names the pushed outputs, committed on a branch of its own and pushed for review: the
    # checkout's branch did not move; a clone of that branch pulls the outputs
    git_env = {**env, "GIT_AUTHOR_NAME": "t", "GIT_AUTHOR_EMAIL": "t@t", "GIT_COMMITTER_NAME": "t",
               "GIT_COMMITTER_EMAIL": "t@t"}
    assert _sh(["git", "rev-parse", "HEAD"], project, git_env).stdout.strip() == main_before
    (branch,) = _sh(["git", "branch", "--list", "retrain/*", "--format=%(refname:short)"], project,
                    git_env).stdout.split()
    head = _sh(["git", "log", "-1", "--format=%H %s", branch], project, git_env).stdout.split(" ", 1)
    assert head[1].startswith("weekly-retrain ") and "DVC remote local" in head[1], head
    assert "checkpoint-summary" in _sh(["git", "show", f"{branch}:dvc.lock"], project, git_env).stdout
    origin = str(project.parent / "origin.git")
    remote_heads = _sh(["git", "ls-remote", "--heads", origin], project, git_env).stdout
    assert remote_heads.splitlines() == [f"{head[0]}\trefs/heads/{branch}"]  # the proposal, and nothing else
    clone = tmp_path / "clone"
    _sh(["git", "clone", "-q", "--branch", branch, origin, str(clone)], tmp_path, git_env)
    assert _sh(["git", "rev-parse", "HEAD"], clone, git_env).stdout.strip() == head[0]
    _sh(["dvc", "pull", "data/checkpoint-summary.json"], clone, env)
    assert (clone / "data/checkpoint-summary.json").read_text() == \
        (project / "data/checkpoint-summary.json").read_text()
    (artifact,) = _artifacts(prefect, "weekly-retrain-summary")
    assert artifact["flow_run_id"] == run["id"] and "dvc push -r local" in artifact["data"]
    assert f"committed as `{head[0]}` on branch `{branch}`, proposed for review" in artifact["data"]
    assert "pushed to git remote `origin`" in artifact["data"]
    print(f"\n[deployments] weekly-retrain runs: {bad['id']} {bad['state']['type']} ({bad['state']['message']}); "
          f"{bad_git['id']} {bad_git['state']['type']} ({bad_git['state']['message']}); "
          f"{run['id']} {run['state']['type']}, commit {head[0][:12]}; artifact key weekly-retrain-summary")


def test_the_drop_test_pairs_items_and_a_flagged_night_is_never_the_baseline(tmp_path):
    from trinity.ops.nightly import append_record, baseline_record

    def night(run, per_item, flagged=False):
        items = {f"gsm8k/{i}": float(v) for i, v in enumerate(per_item)}
        return NightlyRecord(run=run, finished_at="t", checkpoint={}, splits={"gsm8k": "heldout_other"},
                             scores={"trinity": {"gsm8k": sum(per_item) / len(per_item)}},
                             items={"trinity": {"gsm8k": items}}, flagged=flagged)

    base = night("n1", [1] * 10)
    half = compare(base, night("n2", [0] * 5 + [1] * 5), 0.05)  # 5 of 10 items turned wrong: a real drop
    assert half.flagged and half.drops[0].paired[0] == -0.5 and half.drops[0].paired[2] < 0
    noise = compare(base, night("n2", [0] + [1] * 9), 0.05)  # -0.1, but one item: its interval reaches 0
    assert not noise.flagged and noise.changes[0].delta == pytest.approx(-0.1) and noise.changes[0].paired[2] == 0
    few = compare(night("n1", [1] * 3), night("n2", [0] * 3), 0.05)  # every item wrong, but only 3 of them
    assert not few.flagged and few.changes[0].paired == (-1.0, -1.0, -1.0, 3)
    assert "paired 95 % interval" in summary_markdown(night("n2", [0] * 5 + [1] * 5), half)

    assert baseline_record(tmp_path) is None
    append_record(tmp_path, base)
    append_record(tmp_path, night("n2", [0] * 10, flagged=True))
    assert baseline_record(tmp_path).run == "n1"  # the flagged night is not tomorrow's baseline


def test_comparison_flags_only_drops_beyond_the_threshold():
    def record(run, a, b, fingerprint="f1"):
        return NightlyRecord(run=run, finished_at="t", checkpoint={"run_fingerprint": fingerprint},
                             splits={"gsm8k": "heldout", "mt_bench": "heldout"},
                             scores={"trinity": {"gsm8k": a, "mt_bench": b}})

    prev = record("night-1", 0.50, 0.70)
    assert not compare(None, prev, 0.05).flagged
    assert compare(None, prev, 0.05).message().startswith("first nightly evaluation")
    same = compare(prev, record("night-2", 0.45, 0.70), 0.05)  # exactly the threshold: not a drop
    assert not same.flagged and not same.checkpoint_changed
    drop = compare(prev, record("night-2", 0.44, 0.80, fingerprint="f2"), 0.05)
    assert drop.flagged and [(d.method, d.benchmark) for d in drop.drops] == [("trinity", "gsm8k")]
    assert drop.checkpoint_changed and "changed since the previous night" in summary_markdown(
        record("night-2", 0.44, 0.80, "f2"), drop)
    gone = compare(prev, NightlyRecord(run="n3", finished_at="t", checkpoint={}, splits={"gsm8k": "heldout"},
                                       scores={"trinity": {"gsm8k": 0.5}}), 0.05)
    assert not gone.flagged and any(c.benchmark == "mt_bench" and c.current is None for c in gone.changes)
    for bad in (-0.1, 1.0, float("nan"), "0.05", True):
        with pytest.raises(ValueError, match="drop_threshold"):
            compare(prev, prev, bad)


SACRIFICIAL_TEST = textwrap.dedent("""
    import json, subprocess, sys, time
    sys.path.insert(0, {tests!r})
    from process_supervisor import Supervisor
    sup = Supervisor()
    env = {env!r}
    sup.start("server", [sys.executable, "-m", "prefect", "server", "start", "--host", "127.0.0.1", "--port",
                         "{port}"], env, {tmp!r}, {tmp!r} + "/server.log")
    # a grandchild that detaches into a session of its own, as a process worker's flow runs do
    sup.start("detacher", [sys.executable, "-c", "import subprocess, time; subprocess.Popen(['sleep', '600'], "
                           "start_new_session=True); time.sleep(600)"], env, {tmp!r}, {tmp!r} + "/detacher.log")
    deadline = time.time() + 60
    while len(sup.descendants()) < 3 and time.time() < deadline:
        time.sleep(0.5)
    print(json.dumps(sup.descendants() + [sup.proc.pid]), flush=True)
    time.sleep(600)
""")


def test_a_sigkilled_test_leaves_no_process_behind(tmp_path):
    env = {**os.environ, "PREFECT_HOME": str(tmp_path / "home"), "PREFECT_UI_ENABLED": "false"}
    script = SACRIFICIAL_TEST.format(tests=str(Path(__file__).parent), env=env, port=_free_port(), tmp=str(tmp_path))
    test = subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE, text=True)
    try:
        pids = json.loads(test.stdout.readline())
        assert len(pids) >= 4 and alive(pids) == pids  # server, detacher, its detached sleep, the supervisor
        os.kill(test.pid, signal.SIGKILL)
        test.wait(timeout=10)
        deadline = time.monotonic() + 30
        while alive(pids) and time.monotonic() < deadline:
            time.sleep(0.2)
        assert alive(pids) == [], f"left behind after the test was SIGKILLed: {alive(pids)}"
    finally:
        test.kill()


def _latest_flow_run(prefect, flow_name: str) -> dict:
    r = httpx.post(f"{prefect['url']}/flow_runs/filter", timeout=10,
                   json={"flows": {"name": {"any_": [flow_name]}}, "sort": "START_TIME_DESC", "limit": 1})
    r.raise_for_status()
    (run,) = r.json()
    return run


def test_a_stage_flow_shows_its_steps_as_tasks_and_publishes_its_table(project, prefect):
    """`python flows/evaluate.py` (what `dvc repro` runs) against the server: load-params → evaluate →
    publish-artifacts, and the per-benchmark table under its stable key."""
    _sh([sys.executable, "flows/evaluate.py"], project, prefect["env"], timeout=600)
    run = _latest_flow_run(prefect, "trinity-evaluate")
    assert run["state"]["type"] == "COMPLETED"
    task_runs = httpx.post(f"{prefect['url']}/task_runs/filter", timeout=10,
                           json={"flow_runs": {"id": {"any_": [run["id"]]}}}).json()
    assert {t["name"].rsplit("-", 1)[0] for t in task_runs} == {"load-params", "evaluate", "publish-artifacts"}
    (table,) = _artifacts(prefect, "trinity-eval-scores")
    (summary,) = _artifacts(prefect, "trinity-evaluate-summary")
    assert table["flow_run_id"] == summary["flow_run_id"] == run["id"]
    rows = json.loads(table["data"]) if isinstance(table["data"], str) else table["data"]
    results = json.loads((project / "data/eval/results.json").read_text())
    assert {(r["benchmark"], r["split"], r["method"]) for r in rows} == {
        (b["name"], b["split"], m) for b in results["benchmarks"] for m in results["scores"]}
    assert "| trinity | " in summary["data"] and "avg_heldout" in summary["data"]  # the stage's metrics


def test_llm_bound_tasks_retry_an_outage_with_backoff_and_jitter_but_not_bad_input(prefect):
    from prefect import flow, task
    from prefect.cache_policies import NO_CACHE
    from prefect.settings import PREFECT_API_URL, PREFECT_LOGGING_TO_API_ENABLED, temporary_settings

    from trinity.ops.stage_flow import LLM_BOUND_RETRIES

    opts = LLM_BOUND_RETRIES
    assert opts["retries"] == 2 and opts["retry_delay_seconds"](2) == [60, 120] and opts["retry_jitter_factor"] == 0.5
    attempts = []
    errors = {"outage": ConnectionError, "bad input": ValueError}

    def call_model(error: str) -> str:
        attempts.append(error)
        if len(attempts) == 1:
            raise errors[error]("the first attempt fails")
        return "answer"

    # the stage's own retry policy, but no 60 s wait in a test
    call = task(call_model, name="call-model", cache_policy=NO_CACHE, **opts).with_options(retry_delay_seconds=0)

    @flow(name="retry-policy")
    def one_call(error: str):
        return call(error, return_state=True)

    # logs stay local: an API log handler would flush to the server after the fixture stopped it
    with temporary_settings({PREFECT_API_URL: prefect["url"], PREFECT_LOGGING_TO_API_ENABLED: False}):
        outage = one_call("outage", return_state=True)
        assert outage.is_completed() and len(attempts) == 2
        attempts.clear()
        bad = one_call("bad input", return_state=True)
        assert bad.is_failed() and len(attempts) == 1  # bad input is not retried
