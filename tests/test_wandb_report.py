"""The W&B Report of one pipeline run (trinity.ops.wandb_report, `trinity report --wandb`), built from real offline
runs that the stages' own logging code wrote (StageRun, the evolve generation logger, log_eval_results, the
report stage's plot images), with W&B's API client stubbed at its boundary (`wandb.Api`: wandb-workspaces sends
its GraphQL through it). Checked on the report's model — what W&B stores — not on our objects: its sections,
its panels, their run sets filtered to the group, and that every key a panel references was logged by a run of
that group and stage (read back from the runs' transaction logs by this test's own reader)."""
import json
import socket
import warnings
from pathlib import Path

import pytest

from test_tracking_eval import BENCHMARKS, _finished_records, env, make_results, write_plot  # noqa: F401
from trinity import cli
from trinity.stages.evolve import generation_logger
from trinity.evolve.sep_cma import GenerationRecord
from trinity.evaluation.report import PLOTS
from trinity.evaluation.results import EvalResults
from trinity.ops.tracking import GROUP_ENV, StageRun, log_eval_results
from trinity.ops.wandb_report import FITNESS_KEYS, ReportInputError, publish, publish_if_online

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


def logged_keys(wandb_dir: Path) -> dict[tuple[str, str], set[str]]:
    """{(group, job type): every top-level key its run logged (history and summary)}, from the transaction
    logs."""
    out: dict[tuple[str, str], set[str]] = {}
    for run_dir in (wandb_dir / "wandb").glob("offline-run-*"):
        group = job = None
        keys: set[str] = set()
        for r in _finished_records(run_dir):
            kind = r.WhichOneof("record_type")
            if kind == "run":
                group, job = r.run.run_group, r.run.job_type
            elif kind == "history":  # top-level names: a table or an image is stored as its fields (key, field)
                keys |= {i.key or i.nested_key[0] for i in r.history.item}
            elif kind == "summary":
                keys |= {i.key or i.nested_key[0] for i in r.summary.update}
        out.setdefault((group, job), set()).update(keys)
    return out


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


def stub_api(monkeypatch, calls: list):
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


def test_offline_report_model_sections_panels_and_keys(pipeline_runs, monkeypatch):
    wandb_dir = pipeline_runs
    no_api(monkeypatch)
    logged = logged_keys(wandb_dir)
    with warnings.catch_warnings():
        warnings.simplefilter("error", UserWarning)  # e.g. wandb-workspaces' warnings on a run set's columns
        out = publish(wandb_dir, mode="offline")  # default: the newest run's group
    assert out.group == GROUP and not out.saved and "offline" in out.reason and out.url is None
    assert sorted(r.job_type for r in out.runs) == ["evaluate", "evolve", "report"]
    stored = json.loads(out.model_path.read_text())
    assert out.model_path == wandb_dir / "reports" / f"{GROUP}.json" and stored["saved"] is False
    model = stored["report"]
    assert model["displayName"] == f"Trinity pipeline run {GROUP}" and model["project"]["name"] == "trinity"

    secs = sections(model)
    assert list(secs) == ["Scores per benchmark", "Fitness per generation", "Usage by model and role",
                          "Score vs compute"]
    referenced: dict[str, list[str]] = {}
    for title, grids in secs.items():
        assert grids, f"section {title!r} has no panels"
        for grid in grids:
            where = runset_filter(grid)
            assert where["group"] == GROUP, where
            (runset,) = grid["metadata"]["runSets"]
            assert "project" not in runset  # offline: bound to the project when saved
            panels = grid["metadata"]["panelBankSectionConfig"]["panels"]
            assert panels
            for panel in panels:
                keys = panel_keys(panel)
                assert keys, panel
                missing = set(keys) - logged[(GROUP, where["jobType"])]
                assert not missing, f"{title}: {panel['viewType']} references {missing}, not logged by the " \
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


def test_saved_with_a_key_and_the_server_reachable(pipeline_runs, monkeypatch):
    calls: list = []
    stub_api(monkeypatch, calls)
    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen(4)  # the W&B server's address answers (a TCP accept): "network present"
    try:
        monkeypatch.setenv("WANDB_BASE_URL", f"http://127.0.0.1:{server.getsockname()[1]}")
        monkeypatch.setenv("WANDB_API_KEY", "local-test-key-" + "0" * 25)
        monkeypatch.delenv("WANDB_ENTITY", raising=False)
        out = publish(pipeline_runs, group=GROUP, mode="online")
    finally:
        server.close()
    assert out.saved and out.reason is None, out.reason
    assert out.url == f"https://wandb.test/team-t/trinity/reports/Trinity-pipeline-run-{GROUP}--VmlldzoxMjM="
    (upsert,) = [v for q, v in calls if isinstance(q, str) and "upsertView" in q]
    assert upsert["entityName"] == "team-t" and upsert["projectName"] == "trinity" and upsert["type"] == "runs"
    stored = json.loads(out.model_path.read_text())
    assert stored["saved"] is True and stored["url"] == out.url
    assert json.loads(upsert["spec"]) == stored["report"]["spec"]  # the file holds what was saved
    grids = [g for gs in sections(stored["report"]).values() for g in gs]
    for grid in grids:  # saved: every run set bound to the project, filtered to the group
        (runset,) = grid["metadata"]["runSets"]
        assert runset["project"] == {"name": "trinity", "entityName": "team-t", "id": "UHJvamVjdDo0Mg=="}
        assert runset_filter(grid)["group"] == GROUP


def test_not_saved_without_a_key(pipeline_runs, monkeypatch, tmp_path):
    no_api(monkeypatch)
    monkeypatch.delenv("WANDB_API_KEY", raising=False)
    monkeypatch.setenv("NETRC", str(tmp_path / "no-netrc"))
    out = publish(pipeline_runs, group=GROUP, mode="online")
    assert not out.saved and out.reason.startswith("no W&B API key") and out.model_path.is_file()
    # the report stage's hook: nothing offline; online it builds, and says it did not save
    out.model_path.unlink()
    assert publish_if_online(pipeline_runs, group=GROUP, project="trinity", mode="offline") is None
    assert not out.model_path.exists()
    hooked = publish_if_online(pipeline_runs, group=GROUP, project="trinity", mode="online")
    assert hooked is not None and not hooked.saved and hooked.model_path.is_file()
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
