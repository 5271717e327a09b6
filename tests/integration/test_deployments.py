"""Prefect deployments for real: a `prefect server start` on 127.0.0.1 (own PREFECT_HOME), prefect.yaml checked
and registered (`python flows/deploy.py`), a process worker, and `nightly-eval` triggered by a run request on a
tiny configuration whose pool members are an OpenAI-compatible endpoint (tests/fixtures/fake_openai_server.py,
real HTTP) and whose benchmarks are two files of the project's own (`data.user_benchmarks`: every answer is 42).

Night 1 reaches Completed with its two artifacts, on the night's own items (`items_per_benchmark` of each
benchmark, not the pipeline's one or two); then the "provider" silently changes the model behind the endpoint
(right answers become wrong ones) and night 2 — which makes every call again, no stored reply — ends Failed with
the drop in its state message and its artifacts published, and the Automation created at deploy time posts the
failure to a webhook (a real HTTP receiver here); night 3 is compared with night 1, not with the flagged night 2;
night 4, the provider back but one item answered differently (noise), is Completed. A run that ends Crashed or
TimedOut notifies too, and so does a night that did not run (a proactive automation). Overlapping triggers are
refused: a second nightly-eval while one runs (the deployment's concurrency limit), and weekly-retrain while
nightly-eval holds the checkout (its global concurrency limit); a deployment's run without that limit is refused
(Failed, naming `python flows/deploy.py`), a run outside a deployment creates it. weekly-retrain fast-forwards the
checkout to the branch it follows and retrains only when something changed ("nothing changed, nothing retrained"
otherwise), refuses a checkout that cannot fast-forward, and is refused while `trinity serve` holds the store.
Every process the test started (server, worker, the worker's flow-run processes) is gone afterwards, also when the
test itself is SIGKILLed (tests/fixtures/process_supervisor.py). Bad input (a malformed cron, an unknown work pool, a
missing DVC remote, a branch that is not there, too few nightly items, an unreachable API) is refused by name
before anything is registered or any model called."""
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
from trinity.ops.alerts import FAILURE_EVENTS, FINISHED_EVENTS
from trinity.ops.nightly import (SCORES_ARTIFACT_KEY, SUMMARY_ARTIFACT_KEY, NightlyRecord, compare, history_path,
                             summary_markdown)

from fixtures.fake_openai_server import FakeOpenAIServer
from fixtures.process_supervisor import Supervisor, alive

ANSWER = {"value": "42", "wrong_on": None}
"""What the fake endpoint's models answer: every item's answer is 42, so '42' is right and anything else wrong;
`wrong_on`: a text whose item is answered wrong whatever `value` says (noise)."""


def _reply(messages) -> str:
    text = " ".join(str(m.get("content")) for m in messages)
    wrong = ANSWER["wrong_on"] and ANSWER["wrong_on"] in text
    return f"The answer is {41 if wrong else ANSWER['value']}."


SUMS = [{"id": f"s{i}", "type": "math", "question": f"Compute {a} + {b}.", "answer": "42", "answer_type": "number"}
        for i, (a, b) in enumerate([(40, 2), (30, 12), (21, 21), (1, 41), (2, 40), (20, 22), (35, 7), (12, 30),
                                    (41, 1), (22, 20)])]
"""The training benchmark: 2 items trained on, 1 evaluated by the pipeline, the night's 6 from the other 8."""
HELD = [{"id": f"h{i}", "type": "math", "question": q, "answer": "42", "answer_type": "number"}
        for i, q in enumerate(["Tom has 50 apples and gives away 8. How many are left?",
                               "A box holds 6 rows of 7 eggs. How many eggs?",
                               "Ann reads 14 pages a day for 3 days. How many pages?",
                               "A bus has 50 seats and 8 are empty. How many are taken?",
                               "Six friends share 252 stickers equally. How many each?",
                               "A rope of 84 m is cut in half. How long is each piece?",
                               "A shop sells 7 pens a day for 6 days. How many pens?",
                               "Sam is 30 and his sister is 12 years older. How old is she?"])]
"""The held-out benchmark: 2 items evaluated by the pipeline, the night's 6 of the 8."""
NIGHTLY_ITEMS = 6
"""nightly-eval's items_per_benchmark here: more than the 5 paired items a drop needs, fewer than shipped (10)."""


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


def _tiny_params(base_url: str, benchmarks: Path) -> dict:
    member = {"backend": "openai", "base_url": base_url, "max_tokens": 16, "timeout_s": 10.0, "max_retries": 1}
    return {
        "data": {"user_benchmarks": {"sums": str(benchmarks / "sums.jsonl"), "held": str(benchmarks / "held.jsonl")},
                 "train": {"sums": 2}, "in_distribution": {"sums": 1}, "heldout": {"held": 2}},
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
    with FakeOpenAIServer(reply=_reply) as srv:
        yield srv


GIT_ENV = {"GIT_AUTHOR_NAME": "t", "GIT_AUTHOR_EMAIL": "t@t", "GIT_COMMITTER_NAME": "t", "GIT_COMMITTER_EMAIL": "t@t"}


@pytest.fixture(scope="module")
def project(tmp_path_factory, llm):
    """A checkout (flows/, src/, prefect.yaml) with a tiny params.yaml, its benchmarks and the splits the prepare
    stage drew from them, a coordinator trained on them by the evolve stage, and a DVC project with a default
    (local) remote; committed, its branch `main` following `origin/main` (a bare repository), as a clone is."""
    from trinity.stages import paths as stage_paths, run_stage

    tmp = tmp_path_factory.mktemp("deployments")
    repo = tmp / "repo"
    repo.mkdir()
    for item in ("flows", "src", "prefect.yaml"):
        src = PROJECT_ROOT / item
        (shutil.copytree(src, repo / item, ignore=shutil.ignore_patterns("__pycache__", "*.egg-info"))
         if src.is_dir() else shutil.copy(src, repo / item))
    (repo / "benchmarks").mkdir()
    for name, items in (("sums", SUMS), ("held", HELD)):
        (repo / "benchmarks" / f"{name}.jsonl").write_text("".join(json.dumps(i) + "\n" for i in items))
    (repo / "params.yaml").write_text(yaml.safe_dump(_tiny_params(llm.base_url, repo / "benchmarks"),
                                                     sort_keys=False))
    paths = stage_paths.Paths(repo)
    settings = load_settings(repo / "params.yaml")
    run_stage("prepare", settings, paths)
    run_stage("evolve", settings, paths)
    assert paths.checkpoint.with_suffix(".npy").exists()
    env = {**os.environ, "PATH": f"{Path(sys.executable).parent}:{os.environ['PATH']}", **GIT_ENV}
    _sh(["git", "init", "-q", "-b", "main"], repo, env)
    _sh(["dvc", "init", "-q"], repo, env)
    _sh(["dvc", "remote", "add", "-d", "local", str(tmp / "dvc-remote")], repo, env)
    # the pipeline weekly-retrain reproduces here: one cheap stage that reads the checkpoint
    (repo / "dvc.yaml").write_text(yaml.safe_dump({"stages": {"checkpoint-summary": {
        "cmd": "python -c \"import json; m = json.load(open('data/checkpoints/coordinator.json')); "
               "json.dump({'n_params': m['n_params']}, open('data/checkpoint-summary.json', 'w'))\"",
        "deps": ["data/checkpoints/coordinator.json"], "outs": ["data/checkpoint-summary.json"]}}}))
    # committed, as a user's checkout is, following a git remote (a bare repository) weekly-retrain may push to
    (repo / ".gitignore").write_text("data/\n__pycache__/\n*.egg-info/\n")
    _sh(["git", "add", "-A"], repo, env)
    _sh(["git", "commit", "-q", "-m", "tiny project"], repo, env)
    _sh(["git", "init", "-q", "--bare", "-b", "main", str(tmp / "origin.git")], repo, env)
    _sh(["git", "remote", "add", "origin", str(tmp / "origin.git")], repo, env)
    _sh(["git", "push", "-q", "-u", "origin", "main"], repo, env)
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
    nightly["parameters"]["items_per_benchmark"] = 2  # the pipeline's own count: no drop could ever be called
    retrain["parameters"]["dvc_remote"] = "no-such-remote"
    retrain["parameters"]["git_remote"] = "no-such-git-remote"
    retrain["parameters"]["follow"] = "origin/no-such-branch"
    bad["trinity"]["notify"]["on_missed"] = ["nightly-eval", "weekly-retrain", "no-such-deployment"]
    del retrain["schedules"]
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
    assert "deployments[nightly-eval].parameters.items_per_benchmark: items_per_benchmark must be a whole number " \
        ">= 5 (a drop is called on at least 5 paired items; fewer could never flag one), got 2" in err
    assert "deployments[weekly-retrain].parameters.follow: git remote 'origin' has no branch 'no-such-branch' for " \
        "the checkout's branch 'main' to follow" in err
    assert "trinity.notify.on_missed: no deployment named ['no-such-deployment']" in err
    assert "deployments[weekly-retrain]: no active schedule, so no run is expected: take it out of " \
        "trinity.notify.on_missed" in err
    assert "9 problem(s)" in err, err
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
    from trinity.ops.dvc_remote import DvcRemoteError, resolve_dvc_remote

    with pytest.raises(DvcRemoteError, match=r"sets no default remote.*configured remotes: none"):
        resolve_dvc_remote(remote_less, None)
    assert resolve_dvc_remote(project, None) == "local"


@pytest.fixture(scope="module")
def webhook():
    receiver = WebhookReceiver()
    yield receiver
    receiver.httpd.shutdown()


def _run_dir(project, run: dict) -> Path:
    (d,) = [d for d in (project / "data" / "nightly" / "runs").iterdir() if d.name.endswith(run["name"])]
    return d


def test_nightly_eval_deployment_runs_on_a_worker_then_flags_a_silent_model_change(project, prefect, llm, webhook):
    env = prefect["env"]
    doc = yaml.safe_load((project / "prefect.yaml").read_text())
    doc["trinity"]["notify"]["webhook_url"] = webhook.url  # as a user would: a Slack / Teams / any webhook
    (nightly_doc,) = [d for d in doc["deployments"] if d["name"] == "nightly-eval"]
    nightly_doc["parameters"]["items_per_benchmark"] = NIGHTLY_ITEMS
    (project / "prefect.yaml").write_text(yaml.safe_dump(doc, sort_keys=False))
    r = _deploy(project, env)
    assert r.returncode == 0, r.stdout + r.stderr
    assert "2 deployment(s) checked" in r.stdout
    assert "automations: trinity: nightly-eval failed, trinity: weekly-retrain failed, trinity: nightly-eval missed" \
        in r.stdout and "checkout concurrency limit" in r.stdout, r.stdout
    automations = {a["name"]: a for a in httpx.post(f"{prefect['url']}/automations/filter", json={},
                                                    timeout=10).json()}
    assert sorted(automations) == ["trinity: nightly-eval failed", "trinity: nightly-eval missed",
                                   "trinity: weekly-retrain failed"]
    failed = automations["trinity: nightly-eval failed"]["trigger"]
    assert sorted(failed["expect"]) == sorted(FAILURE_EVENTS) and failed["posture"] == "Reactive"
    missed = automations["trinity: nightly-eval missed"]["trigger"]
    assert missed["posture"] == "Proactive" and sorted(missed["expect"]) == sorted(missed["after"]) \
        == sorted(FINISHED_EVENTS) and missed["within"] == (24 + 4 + 1) * 3600, missed
    deployments = {d["name"]: d for d in httpx.post(f"{prefect['url']}/deployments/filter", json={},
                                                     timeout=10).json()}
    assert set(deployments) == {"nightly-eval", "weekly-retrain"}
    nightly = deployments["nightly-eval"]
    assert all(f"prefect.deployment.{nightly['id']}" in json.dumps(automations[f"trinity: nightly-eval {k}"])
               for k in ("failed", "missed"))
    assert nightly["work_pool_name"] == "trinity" and nightly["parameters"]["drop_threshold"] == 0.05
    assert nightly["parameters"]["items_per_benchmark"] == NIGHTLY_ITEMS
    limit = nightly.get("global_concurrency_limit") or {}  # (the deployment's limit, as the API reports it)
    assert (nightly.get("concurrency_limit") or limit.get("limit")) == 1, nightly
    assert nightly["concurrency_options"]["collision_strategy"] == "CANCEL_NEW", nightly
    assert [(s["schedule"]["cron"], s["schedule"]["timezone"]) for s in nightly["schedules"]] == [("0 2 * * *", "UTC")]
    assert nightly["pull_steps"] == [{"prefect.deployments.steps.set_working_directory":
                                      {"directory": str(project)}}]
    prefect["sup"].start("worker", [sys.executable, "-m", "prefect", "worker", "start", "--pool", "trinity",
                                    "--type", "process", "--name", "test-worker"],
                         env, str(project), str(prefect["logs"] / "worker.log"))

    # night 1: the endpoint's models answer right, on the night's own items: NIGHTLY_ITEMS of each benchmark
    ANSWER["value"] = "42"
    calls0 = llm.request_count
    first = _wait_for_run(prefect, _trigger(project, prefect))
    assert first["state"]["type"] == "COMPLETED", (first["state"], (prefect["logs"] / "worker.log").read_text()[-4000:])
    assert webhook.received == []  # a Completed night notifies nobody
    assert llm.request_count > calls0  # real calls to the endpoint, from the worker's flow-run process
    night_items = {split: [json.loads(line) for line in (_run_dir(project, first) / "prepared" /
                                                          f"{split}.jsonl").read_text().splitlines()]
                   for split in ("in_distribution", "heldout", "train")}
    pipeline_items = {split: [json.loads(line) for line in (project / "data" / "prepared" /
                                                             f"{split}.jsonl").read_text().splitlines()]
                      for split in ("in_distribution", "heldout", "train")}
    assert [len(night_items[s]) for s in ("in_distribution", "heldout")] == [NIGHTLY_ITEMS, NIGHTLY_ITEMS]
    assert [len(pipeline_items[s]) for s in ("in_distribution", "heldout")] == [1, 2]  # the pipeline's own: too few
    assert night_items["heldout"][:2] == pipeline_items["heldout"]  # the pipeline's items first, then more
    assert not {t["id"] for t in pipeline_items["train"]} & {t["id"] for t in night_items["in_distribution"]}
    summary = _artifacts(prefect, SUMMARY_ARTIFACT_KEY)
    table = _artifacts(prefect, SCORES_ARTIFACT_KEY)
    assert [a["flow_run_id"] for a in summary] == [first["id"]] and summary[0]["type"] == "markdown"
    assert "OK — first nightly evaluation" in summary[0]["data"]
    rows = json.loads(table[0]["data"]) if isinstance(table[0]["data"], str) else table[0]["data"]
    assert table[0]["type"] == "table" and table[0]["flow_run_id"] == first["id"]
    by = {(row["method"], row["benchmark"]): row for row in rows}
    assert by[("alone:api-a", "held")]["score"] == 1.0 and by[("alone:api-a", "held")]["previous"] is None
    assert {b for _, b in by} == {"sums", "held"}
    history = [json.loads(line) for line in history_path(project).read_text().splitlines()]
    assert [h["run"] for h in history] == [first["name"]]
    assert len(history[0]["items"]["alone:api-a"]["held"]) == NIGHTLY_ITEMS

    # night 2: the provider swapped the model behind the endpoint; no stored reply may hide it
    ANSWER["value"] = "41"
    calls1 = llm.request_count
    second = _wait_for_run(prefect, _trigger(project, prefect))
    assert second["state"]["type"] == "FAILED", second["state"]
    msg = second["state"]["message"]
    assert f"score drop beyond 0.050 since {first['name']}" in msg and "alone:api-a on held 1.000 -> 0.000" in msg
    assert f"(paired -1.000 [-1.000, -1.000], {NIGHTLY_ITEMS} items)" in msg
    assert "alone:api-a on sums 1.000 -> 0.000" in msg  # (the pipeline's 1 item of it could never have shown this)
    (note,) = webhook.wait_for(1)  # the automation fired: the server posted the failure to the block's webhook
    assert note["subject"] == f"Trinity: nightly-eval run {second['name']} ended Failed", note
    assert second["id"] in note["body"] and "score drop beyond 0.050" in note["body"], note
    assert llm.request_count > calls1  # every call made again
    summary = _artifacts(prefect, SUMMARY_ARTIFACT_KEY)
    assert [a["flow_run_id"] for a in summary] == [first["id"], second["id"]]  # the nightly history, one key
    assert "**DROP FLAGGED**" in summary[1]["data"] and "alone:api-b | held | heldout_other | 0.000 | 1.000 | -1.000 " \
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
    assert _steps(task_runs) == {"check-inputs", "evaluate-checkpoint", "compare-with-previous", "publish-artifacts",
                                 "trinity-expand-evaluate"}
    runs = sorted((project / "data" / "nightly" / "runs").iterdir())
    assert len(runs) == 2 and all((d / "results.json").exists() and (d / "store.duckdb").exists() for d in runs)
    # the flow-run processes were the worker's children, in sessions of their own: the supervisor saw them
    assert len(prefect["sup"].seen) >= 3

    # night 3, still broken: compared with night 1 (night 2 was flagged, so it never became the baseline)
    third = _wait_for_run(prefect, _trigger(project, prefect))
    assert third["state"]["type"] == "FAILED" and f"since {first['name']}" in third["state"]["message"], third["state"]
    assert len(webhook.wait_for(2)) == 2 and third["name"] in webhook.received[1]["subject"]

    # night 4: the provider fixed it, but one held-out item is answered differently tonight (noise): a paired
    # -1/6 on that benchmark, whose interval reaches 0 — listed, not flagged; the night is Completed
    ANSWER["value"], ANSWER["wrong_on"] = "42", night_items["heldout"][-1]["prompt"][0].split("\n")[0]
    try:
        fourth = _wait_for_run(prefect, _trigger(project, prefect))
    finally:
        ANSWER["wrong_on"] = None
    assert fourth["state"]["type"] == "COMPLETED", fourth["state"]
    (last,) = _artifacts(prefect, SUMMARY_ARTIFACT_KEY)[-1:]
    assert last["flow_run_id"] == fourth["id"] and re.search(
        r"OK — no score dropped by more than 0\.050 \(with a paired 95 % interval below 0, Holm-corrected over \d+ "
        rf"rows\) since {re.escape(first['name'])}", last["data"]), last["data"]
    assert re.search(r"\| alone:api-a \| held \| heldout_other \| 0\.833 \| 1\.000 \| -0\.167 \| \[-0\.\d+, \+0\.000\] "
                     rf"\({NIGHTLY_ITEMS}\) \|", last["data"]), last["data"]
    history = [json.loads(line) for line in history_path(project).read_text().splitlines()]
    assert [(h["run"], h["flagged"]) for h in history] == [(first["name"], False), (second["name"], True),
                                                          (third["name"], True), (fourth["name"], False)]
    time.sleep(3)
    assert len(webhook.received) == 2  # the noise notified nobody
    print(f"[deployments] automation 'trinity: nightly-eval failed' posted: {webhook.received[0]}")


def _end_a_run_as(prefect, deployment_name: str, state_type: str, name: str, message: str) -> dict:
    """A flow run of the deployment, scheduled a day ahead (no worker takes it), then set to its final state as the
    worker (a dead flow-run process: Crashed) or the flow engine (a flow past its timeout: TimedOut) sets it.
    Through Prefect's client, which retries the server's 503 (SQLite busy under load)."""
    from datetime import datetime, timedelta, timezone

    from prefect.client.orchestration import get_client
    from prefect.client.schemas.objects import StateType
    from prefect.settings import PREFECT_API_URL, temporary_settings
    from prefect.states import Scheduled, State

    with temporary_settings({PREFECT_API_URL: prefect["url"]}), get_client(sync_client=True) as client:
        dep = client.read_deployment_by_name(f"trinity-nightly-eval/{deployment_name}")
        run = client.create_flow_run_from_deployment(
            dep.id, state=Scheduled(scheduled_time=datetime.now(timezone.utc) + timedelta(days=1)))
        result = client.set_flow_run_state(run.id, State(type=StateType(state_type), name=name, message=message),
                                           force=True)
        assert result.status.value == "ACCEPT", result
        return {"id": str(run.id), "name": run.name}


def test_a_crashed_or_timed_out_night_notifies_too(project, prefect, webhook):
    """Prefect names a run's event after its state: a night whose process died ends Crashed
    (`prefect.flow-run.Crashed`), one that ran past its timeout ends TimedOut (a FAILED state named TimedOut,
    `prefect.flow-run.TimedOut`). The states are set as the worker and the flow engine set them; the server emits
    the events, the automation fires and the webhook receives the post."""
    before = len(webhook.received)
    crashed = _end_a_run_as(prefect, "nightly-eval", "CRASHED", "Crashed",
                            "Flow run infrastructure exited with non-zero status code -9.")
    timed_out = _end_a_run_as(prefect, "nightly-eval", "FAILED", "TimedOut",
                              "Flow run exceeded timeout of 14400.0 second(s)")
    posts = webhook.wait_for(before + 2)[before:]
    subjects = sorted(p["subject"] for p in posts)
    assert subjects == sorted([f"Trinity: nightly-eval run {crashed['name']} ended Crashed",
                               f"Trinity: nightly-eval run {timed_out['name']} ended TimedOut"]), posts
    body = {p["subject"]: p["body"] for p in posts}
    assert "exited with non-zero status code -9" in body[f"Trinity: nightly-eval run {crashed['name']} ended Crashed"]
    assert timed_out["id"] in body[f"Trinity: nightly-eval run {timed_out['name']} ended TimedOut"]


def test_a_night_that_did_not_run_notifies(project, prefect, webhook, tmp_path):
    """The proactive automation, with a 15 s window instead of the shipped 29 h: no night finishes, so it fires
    (and, armed at deploy, a first night that never ran notifies too)."""
    doc = yaml.safe_load((project / "prefect.yaml").read_text())
    doc["trinity"]["notify"]["missed_after_minutes"] = 0.25
    short = project / "prefect-missed-test.yaml"  # beside prefect.yaml: `prefect deploy` reads entrypoints from there
    short.write_text(yaml.safe_dump(doc, sort_keys=False))
    try:
        t0 = time.monotonic()
        r = _deploy(project, prefect["env"], "--prefect-file", str(short), "--name", "nightly-eval")
        assert r.returncode == 0 and "trinity: nightly-eval missed" in r.stdout, r.stdout + r.stderr
        deadline = time.monotonic() + 120
        subject = "Trinity: nightly-eval did not run: no run finished within 15 s"
        while not any(p["subject"] == subject for p in webhook.received):
            assert time.monotonic() < deadline, webhook.received
            time.sleep(1)
        (note,) = [p for p in webhook.received if p["subject"] == subject][:1]
        assert "No run of deployment nightly-eval ended Completed, Failed, Crashed, TimedOut within 15 s " \
               "(trinity.notify.missed_after_minutes)" in note["body"] and "prefect worker start" in note["body"]
        print(f"\n[deployments] 'trinity: nightly-eval missed' posted {time.monotonic() - t0:.0f} s after deploy: "
              f"{note['subject']}")
    finally:  # put the shipped window back (a 15 s one would keep posting)
        short.unlink()
        r = _deploy(project, prefect["env"], "--name", "nightly-eval")
        assert r.returncode == 0, r.stdout + r.stderr
    (missed,) = httpx.post(f"{prefect['url']}/automations/filter", timeout=10,
                           json={"automations": {"name": {"any_": ["trinity: nightly-eval missed"]}}}).json()
    assert missed["trigger"]["within"] == 29 * 3600


def test_overlapping_runs_are_refused(project, prefect, llm):
    """While a nightly-eval runs: a second nightly-eval is Cancelled by the server (the deployment's concurrency
    limit), and weekly-retrain is refused by the checkout's global concurrency limit (Cancelled, naming it)."""
    from trinity.ops.checkout_lock import checkout_limit_name

    ANSWER["value"] = "42"
    llm.latency_s = 5.0  # a night long enough to overlap (10 items; below the members' 10 s timeout)
    try:
        running = _trigger(project, prefect, "trinity-nightly-eval/nightly-eval", "items_per_benchmark=5")
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


RETRAIN = "trinity-weekly-retrain/weekly-retrain"


def _git_out(cwd: Path, *args: str) -> str:
    return _sh(["git", *args], cwd, {**os.environ, **GIT_ENV}).stdout.strip()


def test_weekly_retrain_checks_first_then_reproduces_and_pushes(project, prefect, tmp_path):
    from trinity.ops.checkout_lock import store_lock_path
    from trinity.stages.paths import store_path

    bad = _wait_for_run(prefect, _trigger(project, prefect, RETRAIN, "dvc_remote=no-such-remote"))
    assert bad["state"]["type"] == "FAILED" and "DVC remote 'no-such-remote' is not configured" in \
        bad["state"]["message"], bad["state"]
    assert not (project / "dvc.lock").exists()  # refused before the pipeline ran
    bad_git = _wait_for_run(prefect, _trigger(project, prefect, RETRAIN, "git_remote=nowhere"))
    assert bad_git["state"]["type"] == "FAILED" and "git remote 'nowhere' is not configured" in \
        bad_git["state"]["message"] and "origin" in bad_git["state"]["message"], bad_git["state"]
    assert not (project / "dvc.lock").exists()
    main_before = _git_out(project, "rev-parse", "HEAD")
    run = _wait_for_run(prefect, _trigger(project, prefect, RETRAIN, "git_remote=origin"))
    assert run["state"]["type"] == "COMPLETED", (run["state"], (prefect["logs"] / "worker.log").read_text()[-4000:])
    assert run["state"]["message"].startswith("retrained (checkpoint-summary changed; main is at origin/main"), \
        run["state"]
    assert json.loads((project / "data/checkpoint-summary.json").read_text())["n_params"] > 0
    assert "checkpoint-summary" in (project / "dvc.lock").read_text()
    assert store_lock_path(store_path(project)).exists()  # it held the store's writer lock
    # pushed: with the local copy and DVC's cache gone, the output comes back from the remote
    env = {**os.environ, "PATH": f"{Path(sys.executable).parent}:{os.environ['PATH']}"}
    (project / "data/checkpoint-summary.json").unlink()
    shutil.rmtree(project / ".dvc" / "cache")
    _sh(["dvc", "pull", "data/checkpoint-summary.json"], project, env)
    assert json.loads((project / "data/checkpoint-summary.json").read_text())["n_params"] > 0
    # dvc.lock, which names the pushed outputs, committed on a branch of its own and pushed for review: the
    # checkout's branch did not move; a clone of that branch pulls the outputs
    git_env = {**env, **GIT_ENV}
    assert _git_out(project, "rev-parse", "HEAD") == main_before
    (branch,) = _sh(["git", "branch", "--list", "retrain/*", "--format=%(refname:short)"], project,
                    git_env).stdout.split()
    head = _sh(["git", "log", "-1", "--format=%H %s", branch], project, git_env).stdout.split(" ", 1)
    assert head[1].startswith("weekly-retrain ") and "DVC remote local" in head[1], head
    assert "checkpoint-summary" in _sh(["git", "show", f"{branch}:dvc.lock"], project, git_env).stdout
    origin = str(project.parent / "origin.git")
    remote_heads = _sh(["git", "ls-remote", "--heads", origin], project, git_env).stdout
    assert sorted(remote_heads.splitlines()) == sorted([f"{main_before}\trefs/heads/main",  # main: untouched
                                                        f"{head[0]}\trefs/heads/{branch}"])  # and the proposal
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


def test_weekly_retrain_follows_its_branch_and_retrains_only_what_changed(project, prefect, tmp_path):
    """The week after: nothing changed, nothing retrained. A colleague pushes a change to the pipeline's code: the
    checkout fast-forwards to it and retrains. The proposal is merged upstream: the next run fast-forwards over the
    same dvc.lock, and nothing changed again. A checkout with a commit of its own: refused, never merged."""
    origin = str(project.parent / "origin.git")
    git_env = {**os.environ, **GIT_ENV}
    proposals = lambda: _sh(["git", "branch", "--list", "retrain/*", "--format=%(refname:short)"], project,  # noqa
                            git_env).stdout.split()
    before = proposals()
    lock = (project / "dvc.lock").read_text()

    quiet = _wait_for_run(prefect, _trigger(project, prefect, RETRAIN, "git_remote=origin"))
    assert quiet["state"]["type"] == "COMPLETED", quiet["state"]
    head = _git_out(project, "rev-parse", "HEAD")
    assert quiet["state"]["message"] == (f"nothing changed, nothing retrained: main is at origin/main ({head[:12]}): "
                                         "nothing new; `dvc status` finds data, params and code unchanged")
    assert proposals() == before and (project / "dvc.lock").read_text() == lock  # no repro, no commit
    artifact = _artifacts(prefect, "weekly-retrain-summary")[-1]
    assert artifact["flow_run_id"] == quiet["id"] and "**nothing changed, nothing retrained**" in artifact["data"]
    task_runs = httpx.post(f"{prefect['url']}/task_runs/filter", timeout=10,
                           json={"flow_runs": {"id": {"any_": [quiet["id"]]}}}).json()
    assert {t["name"].rsplit("-", 1)[0] for t in task_runs} == {"check-git", "git-fast-forward", "check-dvc-remote",
                                                                 "dvc-status", "publish-retrain-summary"}

    # a colleague changes the pipeline's code (the stage's command) on origin/main
    colleague = tmp_path / "colleague"
    _sh(["git", "clone", "-q", origin, str(colleague)], tmp_path, git_env)
    dvc_yaml = yaml.safe_load((colleague / "dvc.yaml").read_text())
    dvc_yaml["stages"]["checkpoint-summary"]["cmd"] = dvc_yaml["stages"]["checkpoint-summary"]["cmd"].replace(
        "{'n_params': m['n_params']}", "{'n_params': m['n_params'], 'summary': 2}")
    (colleague / "dvc.yaml").write_text(yaml.safe_dump(dvc_yaml))
    _sh(["git", "commit", "-q", "-am", "checkpoint summary v2"], colleague, git_env)
    _sh(["git", "push", "-q", "origin", "main"], colleague, git_env)
    pushed = _git_out(colleague, "rev-parse", "HEAD")
    changed = _wait_for_run(prefect, _trigger(project, prefect, RETRAIN, "git_remote=origin"))
    assert changed["state"]["type"] == "COMPLETED", (changed["state"],
                                                     (prefect["logs"] / "worker.log").read_text()[-4000:])
    assert f"fast-forwarded main {head[:12]} -> {pushed[:12]} (origin/main)" in changed["state"]["message"]
    assert changed["state"]["message"].startswith("retrained (checkpoint-summary changed; ")
    assert _git_out(project, "rev-parse", "HEAD") == pushed and _git_out(project, "log", "--merges", "--format=%H") == ""
    assert json.loads((project / "data/checkpoint-summary.json").read_text())["summary"] == 2
    (new_branch,) = set(proposals()) - set(before)
    assert _git_out(project, "rev-parse", f"{new_branch}^") == pushed
    assert "'summary': 2" in _git_out(project, "show", f"{new_branch}:dvc.lock")

    # the reviewer merges the proposal: the next run brings it, the same dvc.lock, and finds nothing to do
    _sh(["git", "fetch", "-q", "origin"], colleague, git_env)
    _sh(["git", "merge", "-q", "--ff-only", f"origin/{new_branch}"], colleague, git_env)
    _sh(["git", "push", "-q", "origin", "main"], colleague, git_env)
    merged = _git_out(colleague, "rev-parse", "HEAD")
    after_merge = _wait_for_run(prefect, _trigger(project, prefect, RETRAIN))
    assert after_merge["state"]["type"] == "COMPLETED", after_merge["state"]
    assert after_merge["state"]["message"].startswith(f"nothing changed, nothing retrained: fast-forwarded main "
                                                      f"{pushed[:12]} -> {merged[:12]} (origin/main)")
    assert _git_out(project, "status", "--porcelain", "--", "dvc.lock") == ""  # dvc.lock now the committed one

    # a commit only this checkout has, and a new one upstream: no fast-forward; refused, nothing merged or run
    (project / "NOTES.md").write_text("an operator's commit on the scheduler's checkout\n")
    _sh(["git", "add", "NOTES.md"], project, git_env)
    _sh(["git", "commit", "-q", "-m", "local note"], project, git_env)
    local = _git_out(project, "rev-parse", "HEAD")
    (colleague / "more.txt").write_text("x\n")
    _sh(["git", "add", "more.txt"], colleague, git_env)
    _sh(["git", "commit", "-q", "-m", "more"], colleague, git_env)
    _sh(["git", "push", "-q", "origin", "main"], colleague, git_env)
    try:
        diverged = _wait_for_run(prefect, _trigger(project, prefect, RETRAIN))
        assert diverged["state"]["type"] == "FAILED", diverged["state"]
        assert "cannot fast-forward 'main' in " in diverged["state"]["message"] and "it has 1 commit(s) that " \
            "origin/main does not (1 the other way). weekly-retrain only fast-forwards (never merges or drops " \
            "commits)" in diverged["state"]["message"], diverged["state"]
        assert _git_out(project, "rev-parse", "HEAD") == local and proposals() == before + [new_branch]
    finally:
        _sh(["git", "reset", "-q", "--keep", "origin/main"], project, git_env)  # the operator moves the note away
    print(f"\n[deployments] weekly-retrain: {quiet['state']['message']} | {changed['state']['message']} | "
          f"{after_merge['state']['message']} | {diverged['state']['message']}")


def _serve(project, env) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-m", "trinity.cli", "serve", "--port", "0", "--root", str(project)],
                            cwd=project, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)


def test_weekly_retrain_is_refused_while_trinity_serve_holds_the_store(project, prefect):
    """`trinity serve` writes the store `dvc repro` writes: while it serves, a retrain fails at once naming it (and
    notifies); while a retrain holds the store, a server refuses to start, naming the run."""
    from trinity.ops.checkout_lock import StoreLock
    from trinity.stages.paths import store_path

    import threading

    env = prefect["env"]
    server = _serve(project, env)
    lines: list[str] = []
    threading.Thread(target=lambda: lines.extend(server.stdout), daemon=True).start()
    try:
        deadline = time.monotonic() + 240
        while not any("listening on" in line for line in lines):
            assert server.poll() is None and time.monotonic() < deadline, "".join(lines)
            time.sleep(0.5)
        refused = _wait_for_run(prefect, _trigger(project, prefect, RETRAIN))
        assert refused["state"]["type"] == "FAILED", refused["state"]
        msg = refused["state"]["message"]
        assert f"the store {store_path(project)} is being written by trinity serve on 127.0.0.1:0 (pid {server.pid} " \
            in msg and "stop that process" in msg and "trinity serve --store" in msg, msg
        second = subprocess.run([sys.executable, "-m", "trinity.cli", "serve", "--port", "0", "--root", str(project)],
                                cwd=project, env=env, capture_output=True, text=True, timeout=120)
        assert second.returncode == 2 and f"(pid {server.pid} " in second.stderr, second.stderr
    finally:
        server.send_signal(signal.SIGINT)
        server.wait(60)
    after = _wait_for_run(prefect, _trigger(project, prefect, RETRAIN))
    assert after["state"]["type"] == "COMPLETED" and after["state"]["message"].startswith(
        "nothing changed, nothing retrained"), after["state"]
    with StoreLock(store_path(project), "weekly-retrain run brave-otter"):
        t0 = time.monotonic()
        r = subprocess.run([sys.executable, "-m", "trinity.cli", "serve", "--port", "0", "--root", str(project)],
                           cwd=project, env=env, capture_output=True, text=True, timeout=120)
    assert r.returncode == 2, r.stdout + r.stderr
    assert f"trinity: the store {store_path(project)} is being written by weekly-retrain run brave-otter (pid " \
        f"{os.getpid()} " in r.stderr and "this server would be a second writer" in r.stderr, r.stderr
    print(f"\n[deployments] serve vs retrain: {msg} | serve refused in {time.monotonic() - t0:.1f} s: "
          f"{r.stderr.strip()}")


def test_a_deployments_run_without_the_checkout_limit_is_refused(project, prefect, webhook):
    """The checkout's limit is taken strictly: deleted, a scheduled night is refused (Failed, which notifies) with
    the limit, the API and `python flows/deploy.py` named; a run outside a deployment creates it and says so."""
    from trinity.ops.checkout_lock import checkout_limit_name

    name = checkout_limit_name(project)
    httpx.delete(f"{prefect['url']}/v2/concurrency_limits/{name}", timeout=10).raise_for_status()
    before = len(webhook.received)
    night = _wait_for_run(prefect, _trigger(project, prefect, "trinity-nightly-eval/nightly-eval",
                                            "items_per_benchmark=5"))
    assert night["state"]["type"] == "FAILED", night["state"]
    assert f"the checkout's global concurrency limit {name!r} does not exist on {prefect['url']}" in \
        night["state"]["message"] and "`python flows/deploy.py`" in night["state"]["message"], night["state"]
    assert not [d for d in (project / "data/nightly/runs").iterdir() if d.name.endswith(night["name"])]  # ran nothing
    posts = webhook.wait_for(before + 1)[before:]
    assert any(p["subject"] == f"Trinity: nightly-eval run {night['name']} ended Failed" for p in posts), posts
    r = _sh([sys.executable, "flows/weekly_retrain.py"], project, prefect["env"], timeout=600)
    out = r.stdout + r.stderr  # (the run's log)
    assert f"[retrain] not a deployment's run: the checkout's concurrency limit {name!r} was missing on " \
        f"{prefect['url']}; created it (1 slot)" in out, out
    # (what it then does depends on the tests before: "nothing changed" after them, "retrained" run on its own)
    assert re.search(r"Finished in state Completed\('(nothing changed, nothing retrained|retrained \()", out), out
    limit = httpx.get(f"{prefect['url']}/v2/concurrency_limits/{name}", timeout=10).json()
    assert limit["limit"] == 1 and limit["active"], limit


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
    from fixtures.process_supervisor import Supervisor
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
    tests = str(Path(__file__).parents[1])  # tests/: the script imports fixtures.process_supervisor
    script = SACRIFICIAL_TEST.format(tests=tests, env=env, port=_free_port(), tmp=str(tmp_path))
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


def _steps(task_runs: list[dict]) -> set[str]:
    """A flow run's steps: its task runs' names without their run suffix. The evaluate stage's pool runs its
    never-seen calls in a subflow of its own (`trinity-expand-evaluate`, `trinity.pool.task_runner.run_expanding`),
    which Prefect shows in the parent as a task run named after the subflow plus a uuid."""
    expand = "trinity-expand-evaluate"
    return {expand if t["name"].startswith(expand + "-") else t["name"].rsplit("-", 1)[0] for t in task_runs}


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
    assert _steps(task_runs) == {"load-params", "evaluate", "publish-artifacts", "trinity-expand-evaluate"}
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
