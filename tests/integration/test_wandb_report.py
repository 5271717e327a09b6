"""The W&B Report of one pipeline run (trinity.ops.wandb_report, `trinity report --wandb`), built from real offline
runs that the stages' own logging code wrote (StageRun, the evolve generation logger, log_eval_results, the
report stage's plot images). Offline the report is built from the runs' own records (RUN_FILE); online from the
W&B server's public API (`wandb.Api().runs`), which is stubbed here at its boundary — no W&B server runs on this
machine (the stub's runs carry what W&B itself logged, read from the transaction logs; wandb-workspaces sends its
GraphQL through `wandb.Api()._service_api`, also stubbed). Checked: its sections, its panels, their run sets filtered
to the group, that every key a panel references was logged by a run of that group and stage (read back from the
runs' transaction logs by this test's own reader, tests/fixtures/wandb_log.py), and, when saved, what was uploaded."""
import json
import socket
import warnings
from pathlib import Path

import pytest

from test_tracking_eval import BENCHMARKS, _finished_records, env, make_results, write_plot  # noqa: F401
from trinity import cli
from trinity.stages.evolve import generation_logger
from trinity.evolve.records import GenerationRecord
from trinity.evaluation.report import PLOTS
from trinity.evaluation.results import EvalResults
from trinity.ops.tracking import GROUP_ENV, StageRun, log_eval_results
from trinity.ops.wandb_report import FITNESS_KEYS, ReportInputError, local_runs, publish, publish_if_online

GROUP = "dvc-20261204T120000-4242"
POOL = ("smol", "api")
ROLES = ("thinker", "worker", "verifier")


def _generation(g: int) -> GenerationRecord:
    return GenerationRecord(generation=g, best_candidate_fitness=0.5 + g / 10, mean_fitness=0.3 + g / 10, sigma=0.1,
                            calls_made=10, store_hits=2, states_encoded=4, cost_usd=0.01,
                            model_usage={"smol": 3 + g, "api": 1}, role_usage={r: 1 + g for r in ROLES},
                            mean_accuracy=0.5, wall_s=1.0, episodes=8, saved_fitness=0.4 + g / 10,
                            saved_accuracy=0.5)


def log_pipeline(settings, root: Path, group: str) -> None:
    """A pipeline run's W&B runs, logged by the stages' own code: evolve (two generations), evaluate (the
    results tables), report (the report's plots)."""
    import os

    os.environ[GROUP_ENV] = group
    try:
        with StageRun(settings, "evolve", root=root) as run:
            on_generation = generation_logger(run, list(POOL))
            for g in range(2):
                on_generation(_generation(g))
        with StageRun(settings, "evaluate", root=root) as run:
            log_eval_results(run, EvalResults.from_dict(make_results()), None)
        plots = root / "reports" / "plots"
        with StageRun(settings, "report", root=root) as run:
            for stem, _ in PLOTS:
                run.image(f"plots/{stem}", write_plot(plots, stem))  # as stages.report logs reports/plots/*.png
    finally:
        del os.environ[GROUP_ENV]


def witnessed_runs(wandb_dir: Path) -> list[dict]:
    """Each run as W&B's transaction log has it: id, name, group, job type, start, and the top-level keys it logged
    (history, summary; W&B's own `_` keys left out)."""
    out = []
    for run_dir in sorted((wandb_dir / "wandb").glob("offline-run-*")):
        run, history, summary = None, {}, {}
        for r in _finished_records(run_dir):
            kind = r.WhichOneof("record_type")
            if kind == "run" and run is None:
                run = r.run
            elif kind == "history":  # top-level names: a table or an image is stored as its fields (key, field)
                history.update(dict.fromkeys(i.key or i.nested_key[0] for i in r.history.item))
            elif kind == "summary":
                summary.update(dict.fromkeys(i.key or i.nested_key[0] for i in r.summary.update))
        out.append({"id": run.run_id, "name": run.display_name, "group": run.run_group, "job_type": run.job_type,
                    "started": run.start_time.seconds + run.start_time.nanos / 1e9,
                    "history": [k for k in history if not k.startswith("_")],
                    "summary": [k for k in summary if not k.startswith("_")]})
    return out


def logged_keys(wandb_dir: Path) -> dict[tuple[str, str], set[str]]:
    """{(group, job type): every top-level key its run logged (history and summary)}, from the transaction
    logs."""
    out: dict[tuple[str, str], set[str]] = {}
    for r in witnessed_runs(wandb_dir):
        out.setdefault((r["group"], r["job_type"]), set()).update(r["history"], r["summary"])
    return out


def described_sections(described: dict) -> dict[str, list[dict]]:
    """{section heading: its panel grids} of a report's description (`describe`)."""
    return {sec["heading"]: sec["grids"] for sec in described["sections"] if sec["heading"]}


def described_filter(grid: dict) -> dict[str, str]:
    """{"group": ..., "jobType": ...} of a described grid's one run set (its filter expression)."""
    import re

    (runset,) = grid["runsets"]
    return {("group" if k == "Group" else "jobType"): v
            for k, v in re.findall(r"(Group|JobType) = '([^']*)'", runset["filters"])}


def panel_keys(panel: dict) -> list[str]:
    """The run keys a panel of the stored model references."""
    config = panel.get("config", {})
    if panel["viewType"] == "Run History Line Plot":
        return list(config["metrics"])
    if panel["viewType"] == "Media Browser":
        return list(config["mediaKeys"])
    if panel["viewType"] == "Weave":  # runs.summary['<key>'] as a weave expression: a pick of a const key
        node = config["panel2Config"]["exp"]
        assert node["fromOp"]["name"] == "pick" and node["fromOp"]["inputs"]["obj"]["fromOp"]["name"] == "run-summary"
        return [node["fromOp"]["inputs"]["key"]["val"]]
    raise AssertionError(f"unexpected panel {panel['viewType']}")


def sections(model: dict) -> dict[str, list[dict]]:
    """{H2 heading: its panel grids}."""
    out: dict[str, list[dict]] = {}
    current = None
    for block in model["spec"]["blocks"]:
        if block["type"] == "heading" and block["level"] == 2:
            current = block["children"][0]["text"]
            out[current] = []
        elif block["type"] == "panel-grid":
            out[current].append(block)
    return out


def runset_filter(grid: dict) -> dict[str, str]:
    (runset,) = grid["metadata"]["runSets"]
    return {f["key"]["name"]: f["value"] for f in runset["filters"]["filters"] if f["op"] == "="}


class StubServerRun:
    """A run as the W&B server's public API returns it (`wandb.apis.public.Run`: the attributes `server_runs`
    reads), holding what W&B logged for the run (its transaction log)."""

    def __init__(self, witnessed: dict, entity: str, project: str):
        from datetime import datetime, timezone

        self.id, self.name, self.group, self.job_type = (witnessed[k] for k in ("id", "name", "group", "job_type"))
        self.entity, self.project = entity, project
        self.created_at = datetime.fromtimestamp(witnessed["started"], timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")
        self.history_keys = {"keys": {k: {"typeCounts": [{"type": "number", "count": 1}]}
                                      for k in ["_step", *witnessed["history"]]}, "lastStep": 1}
        self.summary = {k: 0 for k in ["_wandb", *witnessed["summary"]]}


class StubServiceApi:
    """W&B's GraphQL transport, as wandb-workspaces reaches it through `wandb.Api()._service_api`."""
    app_url = "https://wandb.test"

    def __init__(self, calls: list):
        self.calls = calls

    def execute_graphql(self, query: str, variables=None):
        self.calls.append((query, variables))
        if "ProjectInternalId" in query:
            return {"project": {"internalId": "UHJvamVjdDo0Mg=="}}
        if "upsertView" in query:
            return {"upsertView": {"view": {"id": "VmlldzoxMjM=", "type": "runs", "name": "r1", "displayName":
                                            variables["displayName"], "description": variables["description"],
                                            "project": {"id": "p", "name": variables["projectName"],
                                                        "entityName": variables["entityName"]},
                                            "spec": variables["spec"]}, "inserted": True}}
        raise AssertionError(f"unexpected query {query[:60]}")


def stub_api(monkeypatch, calls: list, server_runs: list[dict]):
    import wandb

    class Project:
        name = "trinity"

    class StubApi:
        default_entity = "team-t"

        def __init__(self, *a, **kw):
            self._service_api = StubServiceApi(calls)

        def projects(self, entity=None):
            return [Project()]

        def create_project(self, name, entity):
            calls.append(("create_project", name))

        def runs(self, path, filters=None, order="+created_at", **kw):
            calls.append(("runs", path, filters))
            entity, project = path.split("/")
            chosen = [StubServerRun(r, entity, project) for r in server_runs if r["group"] == filters["group"]]
            return sorted(chosen, key=lambda r: r.created_at)

    monkeypatch.setattr(wandb, "Api", StubApi)


def no_api(monkeypatch):
    import wandb

    def refuse(*a, **kw):
        raise AssertionError("offline: the W&B API must not be asked")

    monkeypatch.setattr(wandb, "Api", refuse)


@pytest.fixture
def pipeline_runs(env, tmp_path):  # noqa: F811
    """Two pipeline runs: an older one (another group), then GROUP."""
    log_pipeline(env, tmp_path, "dvc-20261203T090000-17")
    log_pipeline(env, tmp_path, GROUP)
    return tmp_path / "wandb"


def test_each_run_records_the_keys_w_and_b_logged(pipeline_runs):
    """The record a stage's run writes when it ends (RUN_FILE) says what W&B's own log holds for it."""
    witnessed = {r["id"]: r for r in witnessed_runs(pipeline_runs)}
    records = local_runs(pipeline_runs)
    assert len(records) == len(witnessed) == 6
    for r in records:
        w = witnessed[r.id]
        assert (r.name, r.group, r.job_type) == (w["name"], w["group"], w["job_type"])
        assert set(r.keys) == set(w["history"]) | set(w["summary"]), r.job_type
        assert r.started == pytest.approx(w["started"], abs=1e-3)


def test_offline_report_sections_panels_and_keys(pipeline_runs, monkeypatch):
    wandb_dir = pipeline_runs
    no_api(monkeypatch)
    logged = logged_keys(wandb_dir)
    with warnings.catch_warnings():
        warnings.simplefilter("error", UserWarning)  # e.g. wandb-workspaces' warnings on a run set's columns
        out = publish(wandb_dir, mode="offline")  # default: the newest run's group
    assert out.group == GROUP and not out.saved and "offline" in out.reason and out.url is None
    assert sorted(r.job_type for r in out.runs) == ["evaluate", "evolve", "report"]
    stored = json.loads(out.description_path.read_text())
    assert out.description_path == wandb_dir / "reports" / f"{GROUP}.json" and stored["saved"] is False
    described = stored["report"]
    assert described["title"] == f"Trinity pipeline run {GROUP}" and described["project"] == "trinity"

    secs = described_sections(described)
    assert list(secs) == ["Scores per benchmark", "Fitness per generation", "Usage by model and role",
                          "Score vs compute"]
    referenced: dict[str, list[str]] = {}
    for title, grids in secs.items():
        assert grids, f"section {title!r} has no panels"
        for grid in grids:
            where = described_filter(grid)
            assert where["group"] == GROUP, where
            (runset,) = grid["runsets"]
            assert runset["project"] == ""  # offline: bound to the project when saved
            assert grid["panels"]
            for panel in grid["panels"]:
                keys = panel["keys"]
                assert keys, panel
                missing = set(keys) - logged[(GROUP, where["jobType"])]
                assert not missing, f"{title}: {panel['type']} references {missing}, not logged by the " \
                                    f"{where['jobType']} run of {GROUP}"
                referenced.setdefault(title, []).extend(keys)

    # what each section shows, as the stages log it
    scores = referenced["Scores per benchmark"]
    assert scores[:1] == ["eval/summary"] and "eval/paired" in scores and "plots/scores" in scores
    assert {f"eval/{b}" for b in BENCHMARKS} <= set(scores)
    assert set(FITNESS_KEYS) <= set(referenced["Fitness per generation"])
    usage = set(referenced["Usage by model and role"])
    assert {f"model_usage/{m}" for m in POOL} | {f"role_usage/{r}" for r in ROLES} | {"plots/usage"} <= usage
    assert {"plots/score_vs_compute", "calls_total", "cost_usd_total"} <= set(referenced["Score vs compute"])

    # the older run is reachable by its group, and has its own report
    older = publish(wandb_dir, group="dvc-20261203T090000-17", mode="offline")
    assert older.group == "dvc-20261203T090000-17" and {r.id for r in older.runs}.isdisjoint(r.id for r in out.runs)


def _online(monkeypatch):
    """A W&B server address that answers (a TCP accept: "network present") and an API key."""
    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen(4)
    monkeypatch.setenv("WANDB_BASE_URL", f"http://127.0.0.1:{server.getsockname()[1]}")
    monkeypatch.setenv("WANDB_API_KEY", "local-test-key-" + "0" * 25)
    monkeypatch.delenv("WANDB_ENTITY", raising=False)
    return server


def test_saved_with_a_key_and_the_server_reachable(pipeline_runs, monkeypatch):
    """Online, the runs and their keys come from the server (the public API), not from this machine's records:
    the server's evolve run here lacks `cost_usd_total` (as a run logged elsewhere might), and the saved report
    does not reference it. What was uploaded (the upsertView spec) shows the panels the description lists."""
    calls: list = []
    on_server = [r for r in witnessed_runs(pipeline_runs) if r["group"] == GROUP]
    for r in on_server:
        if r["job_type"] == "evolve":
            r["history"] = [k for k in r["history"] if k != "cost_usd_total"]
            r["summary"] = [k for k in r["summary"] if k != "cost_usd_total"]
    stub_api(monkeypatch, calls, on_server)
    server = _online(monkeypatch)
    try:
        out = publish(pipeline_runs, group=GROUP, mode="online")
    finally:
        server.close()
    assert out.saved and out.reason is None, out.reason
    assert ("runs", "team-t/trinity", {"group": GROUP}) in calls
    assert {r.path for r in out.runs} == {f"team-t/trinity/{r['id']}" for r in on_server}
    assert out.url == f"https://wandb.test/team-t/trinity/reports/Trinity-pipeline-run-{GROUP}--VmlldzoxMjM="
    (upsert,) = [c[1] for c in calls if isinstance(c[0], str) and "upsertView" in c[0]]
    assert upsert["entityName"] == "team-t" and upsert["projectName"] == "trinity" and upsert["type"] == "runs"
    stored = json.loads(out.description_path.read_text())
    assert stored["saved"] is True and stored["url"] == out.url
    described = described_sections(stored["report"])
    uploaded = sections({"spec": json.loads(upsert["spec"])})
    assert list(uploaded) == list(described)
    for title, grids in uploaded.items():  # saved: every run set bound to the project, filtered to the group
        assert [[panel_keys(p) for p in g["metadata"]["panelBankSectionConfig"]["panels"]] for g in grids] == \
            [[p["keys"] for p in g["panels"]] for g in described[title]], title
        for grid in grids:
            (runset,) = grid["metadata"]["runSets"]
            assert runset["project"] == {"name": "trinity", "entityName": "team-t", "id": "UHJvamVjdDo0Mg=="}
            assert runset_filter(grid)["group"] == GROUP
    compute = [k for g in described["Score vs compute"] for p in g["panels"] for k in p["keys"]]
    assert "calls_total" in compute and "cost_usd_total" not in compute


def test_online_but_the_groups_runs_are_not_on_the_server(pipeline_runs, monkeypatch):
    """Offline runs not synced yet: nothing on the server to point the report at; built from the local records,
    not saved, and the reason says how to get them there."""
    calls: list = []
    stub_api(monkeypatch, calls, [])
    server = _online(monkeypatch)
    try:
        out = publish(pipeline_runs, group=GROUP, mode="online")
    finally:
        server.close()
    assert not out.saved and "no run of group" in out.reason and "trinity.ops.tracking sync" in out.reason
    assert sorted(r.job_type for r in out.runs) == ["evaluate", "evolve", "report"]
    assert not [c for c in calls if isinstance(c[0], str) and "upsertView" in c[0]]


def test_not_saved_without_a_key(pipeline_runs, monkeypatch, tmp_path):
    no_api(monkeypatch)
    monkeypatch.delenv("WANDB_API_KEY", raising=False)
    monkeypatch.setenv("NETRC", str(tmp_path / "no-netrc"))
    out = publish(pipeline_runs, group=GROUP, mode="online")
    assert not out.saved and out.reason.startswith("no W&B API key") and out.description_path.is_file()
    # the report stage's hook: nothing offline; online it builds, and says it did not save
    out.description_path.unlink()
    assert publish_if_online(pipeline_runs, group=GROUP, project="trinity", mode="offline") is None
    assert not out.description_path.exists()
    hooked = publish_if_online(pipeline_runs, group=GROUP, project="trinity", mode="online")
    assert hooked is not None and not hooked.saved and hooked.description_path.is_file()
    # ... and a group without runs does not fail the stage
    assert publish_if_online(pipeline_runs, group="nope", project="trinity", mode="online") is None


def test_cli_report_wandb(pipeline_runs, capsys, monkeypatch, tmp_path):
    no_api(monkeypatch)
    root = tmp_path  # WANDB_DIR is tmp/wandb: the fixture's; --root is only used when WANDB_DIR is unset
    assert cli.main(["report", "--wandb", "--root", str(root)]) == cli.EXIT_OK
    out = capsys.readouterr()
    assert f"W&B report of group {GROUP}" in out.out and "built but NOT saved" in out.err
    assert (pipeline_runs / "reports" / f"{GROUP}.json").is_file()

    assert cli.main(["report", "--wandb", "--group", "no-such-run", "--root", str(root)]) == cli.EXIT_USAGE
    err = capsys.readouterr().err
    assert "no W&B run of group 'no-such-run'" in err and GROUP in err

    # without --wandb: the markdown report from the pipeline's files, which this project does not have
    assert cli.main(["report", "--root", str(root)]) == cli.EXIT_USAGE
    assert "results.json not found" in capsys.readouterr().err

    monkeypatch.setenv("WANDB_DIR", str(tmp_path / "elsewhere"))
    assert cli.main(["report", "--wandb", "--root", str(root)]) == cli.EXIT_USAGE
    assert "no W&B runs" in capsys.readouterr().err


def test_no_runs_is_bad_input(tmp_path):
    with pytest.raises(ReportInputError, match="does not exist"):
        publish(tmp_path / "nothing")
    (tmp_path / "wandb").mkdir()
    with pytest.raises(ReportInputError, match="no W&B runs under"):
        publish(tmp_path)
