"""End to end: `dvc repro` runs the five Prefect flows on a tiny real profile (real models, real DVC,
ephemeral Prefect API, W&B offline); a second repro runs nothing; an evolve.* change re-runs evolve and
what follows only; a forced re-run of a finished stage resumes it; an edit of the code that shapes results
re-runs evolve as a new run (not the old parameters saved again), from stored calls only."""
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from trinity.config import PROJECT_ROOT, load_settings

TINY = {
    "data": {"root": "unused", "train": {"math500": 2, "mmlu": 1}, "in_distribution": {"math500": 1},
             "heldout": {"gsm8k": 2, "mt_bench": 1}, "math500_max_level": 1},
    "pool": {"members": [
        {"name": "smol-a", "backend": "local", "model": "smollm2-135m-instruct", "max_tokens": 40, "temperature": 0.7},
        {"name": "smol-b", "backend": "local", "model": "smollm2-135m-instruct", "max_tokens": 24, "temperature": 0.2},
    ]},
    "coordinator": {"max_turns": 2, "thinker_max_tokens": 24, "verifier_max_tokens": 6, "max_encode_tokens": 512},
    "evolve": {"generations": 2, "popsize": 4, "episodes_per_candidate": 2},
    "evaluate": {"judge": "smol-a", "judge_max_tokens": 24, "bootstrap_resamples": 200},
}


def _env(tmp: Path) -> dict:
    env = dict(os.environ)
    env.pop("TRINITY_DATA_DIR", None)  # data.root names the benchmarks: DVC tracks that directory
    env.update({
        "PATH": f"{Path(sys.executable).parent}:{env['PATH']}",
        "PREFECT_HOME": str(tmp / "prefect"), "WANDB_MODE": "offline", "WANDB_DIR": str(tmp / "wandb"),
        "GIT_AUTHOR_NAME": "t", "GIT_AUTHOR_EMAIL": "t@t", "GIT_COMMITTER_NAME": "t", "GIT_COMMITTER_EMAIL": "t@t",
    })
    return env


def _sh(cmd, cwd, env, timeout=900):
    r = subprocess.run(cmd, cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout)
    assert r.returncode == 0, f"{cmd} failed ({r.returncode}):\n{r.stdout[-4000:]}\n{r.stderr[-4000:]}"
    return r.stdout + r.stderr


@pytest.fixture(scope="module")
def repo(tmp_path_factory, root):
    tmp = tmp_path_factory.mktemp("pipeline")
    repo = tmp / "repo"
    repo.mkdir()
    for item in ("dvc.yaml", "flows", "src", "benchmarks"):
        src = PROJECT_ROOT / item
        (shutil.copytree(src, repo / item, ignore=shutil.ignore_patterns("__pycache__", "*.egg-info"))
         if src.is_dir() else shutil.copy(src, repo / item))
    (repo / "params.yaml").write_text(yaml.safe_dump({**TINY, "data": {**TINY["data"], "root": str(root)}}))
    # DVC wants every tracked key spelled out: write the tiny profile with all defaults filled in
    full = load_settings(repo / "params.yaml").model_dump(exclude={"source_path"})
    (repo / "params.yaml").write_text(yaml.safe_dump(full, sort_keys=False))
    env = _env(tmp)
    _sh(["git", "init", "-q"], repo, env)
    _sh(["dvc", "init", "-q"], repo, env)
    # the project's own DVC config and git-ignores: its default remote (a directory beside the checkout, here
    # beside repo/ in the test's temp dir) and data/ out of git
    shutil.copy(PROJECT_ROOT / ".dvc" / "config", repo / ".dvc" / "config")
    shutil.copy(PROJECT_ROOT / ".gitignore", repo / ".gitignore")
    out = _sh(["dvc", "repro"], repo, env)
    first = json.loads((repo / "data/checkpoints/coordinator.json").read_text())
    return repo, env, out, first


def test_repro_produces_checkpoint_report_and_wandb_run(repo):
    repo, env, out, _ = repo
    for stage in ("prepare", "encode", "evolve", "router", "evaluate", "report"):
        assert f"Running stage '{stage}'" in out
    meta = json.loads((repo / "data/checkpoints/coordinator.json").read_text())
    assert meta["n_params"] == (2 + 3) * meta["dim"] and meta["head_shape"] == [5, meta["dim"]]
    assert meta["params_hash"] and meta["encoder"] and [p["name"] for p in meta["pool"]] == ["smol-a", "smol-b"]
    summary = (repo / "reports/summary.md").read_text()
    for method in ("trinity", "router", "alone:smol-a", "alone:smol-b", "random-routing", "oracle:best-single"):
        assert method in summary
    router = json.loads((repo / "data/router/router.json").read_text())
    assert router["n_params"] == meta["n_params"] and router["run_fingerprint"] != meta["run_fingerprint"]
    res = json.loads((repo / "data/eval/results.json").read_text())

    def ids(name):
        return {json.loads(l)["id"] for l in (repo / f"data/prepared/{name}.jsonl").read_text().splitlines()}

    train, in_dist, held = ids("train"), ids("in_distribution"), ids("heldout")
    assert held and in_dist and not (train & (held | in_dist)) and res["n_items"] == len(held | in_dist)
    assert [(b["name"], b["split"]) for b in res["benchmarks"]] == [
        ("math500", "in_distribution"), ("mt_bench", "heldout"), ("gsm8k", "heldout_other")]
    assert set(res["pooled_paired"]) == {"in_distribution", "heldout", "heldout_other"}
    assert {c["b"] for c in res["pooled_paired"]["in_distribution"]["comparisons"]} >= {"router", "random-routing"}
    # MT-Bench was judged by the configured judge, through the store; every verdict is accounted for (a turn the
    # method gave no answer to scores the minimum without a judge call)
    rows = [json.loads(l) for l in (repo / "data/eval/episodes.jsonl").read_text().splitlines()]
    answerless = sum(1 for r in rows for j in (r["judge"] or []) if j["prompt"] is None)
    assert res["judge"]["name"] == "smol-a" and res["judge"]["verdicts"] + res["judge"]["unparseable"] + \
        res["judge"]["failed"] + answerless == 2 * 5  # two conversation turns x five methods
    assert {(r["method"], r["task_id"]) for r in rows} == {
        (m, t) for m in ("trinity", "router", "alone:smol-a", "alone:smol-b", "random-routing") for t in held | in_dist}
    for name in ("scores", "usage", "fitness", "score_vs_compute"):
        assert (repo / f"reports/plots/{name}.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert "## " in (repo / "reports/traces.md").read_text()
    runs = list((Path(env["WANDB_DIR"]) / "wandb").glob("offline-run-*"))
    assert len(runs) >= 6 and all(list(r.glob("*.wandb")) for r in runs)
    # one W&B group for the repro (its dvc process), and the W&B Report of it, built offline from its runs
    from trinity.ops.wandb_report import local_runs, publish
    groups = {r.group for r in local_runs(Path(env["WANDB_DIR"]))}
    assert len(groups) == 1 and next(iter(groups)).startswith("dvc-"), groups
    built = publish(Path(env["WANDB_DIR"]), mode="offline")
    assert not built.saved and built.group in groups and built.description_path.is_file()
    assert sorted(r.job_type for r in built.runs) == sorted(("prepare", "encode", "evolve", "router", "evaluate",
                                                             "report"))
    described = json.loads(built.description_path.read_text())["report"]
    media = {k for sec in described["sections"] for g in sec["grids"] for p in g["panels"]
             if p["type"] == "MediaBrowser" for k in p["keys"]}
    assert {"plots/scores", "plots/fitness", "plots/usage", "plots/score_vs_compute"} <= media
    assert not (repo / "data/exports").exists()  # the store's export is `trinity export`, no stage output
    # DVC reads the same results: the top-level metrics and plots
    r = subprocess.run(["dvc", "metrics", "show", "--json"], cwd=repo, env=env, capture_output=True, text=True,
                       timeout=300)
    assert r.returncode == 0, r.stderr
    shown = json.dumps(json.loads(r.stdout))
    assert "avg_in_distribution" in shown and "random-routing" in shown and "saved_fitness" in shown
    _sh(["dvc", "plots", "show", "-o", str(repo / "dvc_plots")], repo, env)
    assert (repo / "dvc_plots/index.html").exists()


def test_second_repro_runs_nothing(repo):
    repo, env, _, first = repo
    out = _sh(["dvc", "repro"], repo, env)
    assert "Running stage" not in out


def test_runtime_settings_and_orchestration_code_rerun_nothing(repo):
    """Switching evolve to Dask, changing the concurrency cap or the stages' retry policy (orchestration code) leaves
    `dvc status` clean: nothing re-runs a multi-hour evolve for them; a setting that shapes results still does."""
    repo, env, _, _ = repo
    params, flow = repo / "params.yaml", repo / "src/trinity/ops/stage_flow.py"
    saved = params.read_text(), flow.read_text()
    try:
        p = yaml.safe_load(saved[0])
        p["pool"]["max_concurrency"] = 3
        p["pool"].update(task_runner="dask", dask_workers=3, dask_threads_per_worker=2,
                         dask_address="tcp://127.0.0.1:8786")
        params.write_text(yaml.safe_dump(p, sort_keys=False))
        flow.write_text(saved[1].replace("LLM_BOUND_RETRIES = dict(retries=2,", "LLM_BOUND_RETRIES = dict(retries=5,"))
        assert flow.read_text() != saved[1]
        assert "Data and pipelines are up to date." in _sh(["dvc", "status"], repo, env)
        p["evolve"]["sigma0"] = 0.5
        params.write_text(yaml.safe_dump(p, sort_keys=False))
        status = _sh(["dvc", "status"], repo, env)
        assert "evolve:" in status and "evolve.sigma0" in status, status
    finally:
        params.write_text(saved[0])
        flow.write_text(saved[1])


def test_the_store_is_the_checkouts_own_or_the_one_named_explicitly(tmp_path, monkeypatch):
    """A run in a copy of the checkout (DVC's `dvc exp run --temp`) shares a store only when told which:
    TRINITY_STORE, an absolute path (`make ablation` sets it); a relative path or a directory is refused by name."""
    from trinity.stages.paths import STORE_ENV, Paths

    ws = tmp_path / "ws"
    assert Paths(ws).store == ws / "data/store/trinity.duckdb"
    shared = tmp_path / "shared" / "trinity.duckdb"
    monkeypatch.setenv(STORE_ENV, str(shared))
    copy = ws / ".dvc/tmp/exps/standalone/tmpef34gh"
    assert Paths(copy).store == shared and Paths(ws).store == shared
    assert Paths(copy).checkpoint == copy / "data/checkpoints/coordinator"  # its outputs stay its own
    monkeypatch.setenv(STORE_ENV, "data/store/trinity.duckdb")
    with pytest.raises(ValueError, match="TRINITY_STORE='data/store/trinity.duckdb': the store's path must be absolute"):
        Paths(ws).store
    monkeypatch.setenv(STORE_ENV, str(tmp_path))
    with pytest.raises(ValueError, match="is a directory: name the store's file"):
        Paths(ws).store


DVC_OUTPUTS = ("data/prepared/train.jsonl", "data/prepared/in_distribution.jsonl", "data/prepared/heldout.jsonl",
               "data/prepared/validation.jsonl",
               "data/encode/root_states.parquet", "data/checkpoints/coordinator.npy",
               "data/checkpoints/coordinator.json", "data/eval/episodes.jsonl",
               "data/eval/results.json")
METRICS = ("reports/metrics/prepare.json", "reports/metrics/encode.json", "reports/metrics/evolve.json",
           "reports/metrics/router.json", "reports/metrics/evaluate.json")
PLOT_DATA_IN_GIT = ("data/evolve/history.json",)
"""What the pipeline writes under data/ (git-ignored): DVC's cache and remote carry every one of them. The stages'
metrics (`METRICS`, what `dvc metrics show` reads) and evolve's fitness history (`PLOT_DATA_IN_GIT`, what `dvc plots
show` reads) are in git instead."""


def test_metrics_are_in_git_so_a_fresh_clone_shows_them_without_a_pull(repo, tmp_path):
    """The stages' metrics files are git's, not DVC's cache's (`cache: false`, not git-ignored), and a
    fresh clone (no `dvc pull`) reads them in `dvc metrics show` and `dvc exp show` (not `!`)."""
    repo, env, _, _ = repo
    ignored = subprocess.run(["git", "check-ignore", *METRICS, *PLOT_DATA_IN_GIT], cwd=repo, env=env,
                             capture_output=True, text=True)
    assert ignored.stdout == "", f"git-ignored: {ignored.stdout}"
    lock = yaml.safe_load((repo / "dvc.lock").read_text())
    outs = {o["path"]: o for st in lock["stages"].values() for o in st.get("outs", [])}
    assert set(METRICS) | set(PLOT_DATA_IN_GIT) <= set(outs)
    _sh(["git", "add", "-A"], repo, env)
    _sh(["git", "commit", "-q", "--allow-empty", "-m", "pipeline run"], repo, env)
    clone = tmp_path / "clone"
    _sh(["git", "clone", "-q", str(repo), str(clone)], tmp_path, env)
    assert not (clone / "data/eval/results.json").exists()  # DVC's outputs are not there without a pull
    r = subprocess.run(["dvc", "metrics", "show", "--json"], cwd=clone, env=env, capture_output=True, text=True,
                       timeout=300)
    assert r.returncode == 0, r.stderr
    shown = json.loads(r.stdout)
    (workspace,) = shown.values()
    files = workspace["data"]
    assert all("error" not in files[m] for m in METRICS), files
    assert files["reports/metrics/evolve.json"]["data"]["saved_fitness"] == \
        json.loads((repo / "reports/metrics/evolve.json").read_text())["saved_fitness"]
    table = _sh(["dvc", "exp", "show", "--no-pager", "--md", "--drop", ".*", "--keep", "Experiment|saved_fitness"],
                clone, env)
    assert "!" not in table, table
    r = subprocess.run(["dvc", "plots", "show", "--json", "-o", str(tmp_path / "plots")], cwd=clone, env=env,
                       capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr
    assert "errors" not in json.loads(r.stdout), r.stdout  # the fitness curve: data/evolve/history.json is in git
    print(f"\n[dvc] a fresh clone's exp show:\n{table}")


def _remote_files(remote: Path) -> set[str]:
    return {str(p.relative_to(remote)) for p in remote.rglob("*") if p.is_file()}


def test_push_then_pull_restores_every_output_byte_for_byte(repo):
    """`dvc push` to the default remote of .dvc/config, every output and DVC's cache deleted, `dvc pull`: the
    prepared data, the checkpoint and the evaluation come back identical and `dvc status` is clean. A remote of
    one's own (`dvc remote add -d --local`) then takes over as the default."""
    from trinity.ops.dvc_remote import resolve_dvc_remote

    repo, env, _, _ = repo
    default = repo.parent / "trinity-dvc-storage"  # ../../trinity-dvc-storage, resolved against repo/.dvc
    assert _sh(["dvc", "remote", "list"], repo, env).split() == ["storage", str(default), "(default)"]
    assert resolve_dvc_remote(repo, None) == "storage"  # what weekly-retrain and flows/deploy.py check
    before = {p: (repo / p).read_bytes() for p in DVC_OUTPUTS}
    pushed = _sh(["dvc", "push"], repo, env)
    assert "pushed" in pushed and _remote_files(default)
    for p in DVC_OUTPUTS:
        (repo / p).unlink()
    shutil.rmtree(repo / ".dvc" / "cache")
    assert "deleted" in _sh(["dvc", "status"], repo, env)
    pulled = _sh(["dvc", "pull"], repo, env)
    assert {p: (repo / p).read_bytes() for p in DVC_OUTPUTS} == before
    assert "Data and pipelines are up to date." in _sh(["dvc", "status"], repo, env)
    print(f"\n[dvc] push: {pushed.strip().splitlines()[-1]}; pull: {pulled.strip().splitlines()[-1]}")

    mine = repo.parent / "my-remote"
    _sh(["dvc", "remote", "add", "-d", "--local", "mine", str(mine)], repo, env)
    try:
        assert resolve_dvc_remote(repo, None) == "mine"
        _sh(["dvc", "push"], repo, env)
        assert _remote_files(mine) == _remote_files(default)
    finally:
        _sh(["dvc", "remote", "remove", "--local", "mine"], repo, env)


def test_checkpoint_is_a_model_artifact_dvc_can_fetch(repo, tmp_path):
    """dvc.yaml's top-level `artifacts:` entry: a commit tagged as a version of it (the Git tag format of DVC's
    model registry, `<artifact>@v<semver>`), then `dvc artifacts get` fetches that version's checkpoint."""
    repo, env, _, _ = repo
    _sh(["git", "add", "-A"], repo, env)
    _sh(["git", "commit", "-q", "--allow-empty", "-m", "pipeline run"], repo, env)
    _sh(["git", "tag", "-a", "coordinator@v0.1.0", "-m", "tiny pipeline run"], repo, env)
    _sh(["dvc", "artifacts", "get", str(repo), "coordinator", "--rev", "v0.1.0", "-o", str(tmp_path / "model")],
        repo, env)
    for name in ("coordinator.npy", "coordinator.json"):
        assert (tmp_path / "model" / name).read_bytes() == (repo / "data/checkpoints" / name).read_bytes()
    from dvc.repo import Repo

    with Repo(str(repo)) as r:
        (art,) = r.artifacts.read()["dvc.yaml"].values()
    assert art.type == "model" and art.path == "data/checkpoints"


def test_weekly_retrain_without_a_dvc_remote_fails_by_name_before_any_stage(repo, tmp_path):
    """A checkout whose DVC config names no remote: weekly-retrain (`dvc repro` then `dvc push`) stops at its
    check, naming the config file, before the pipeline runs or any model is called; plain `dvc push` there fails
    too."""
    src_repo, env, _, _ = repo
    bare = tmp_path / "no-remote"
    bare.mkdir()
    for item in ("dvc.yaml", "params.yaml", "flows", "src", "benchmarks"):
        src = src_repo / item
        (shutil.copytree(src, bare / item, ignore=shutil.ignore_patterns("__pycache__"))
         if src.is_dir() else shutil.copy(src, bare / item))
    _sh(["git", "init", "-q"], bare, env)
    _sh(["dvc", "init", "-q"], bare, env)
    r = subprocess.run([sys.executable, "flows/weekly_retrain.py"], cwd=bare, env=env, capture_output=True,
                       text=True, timeout=300)
    out = r.stdout + r.stderr
    assert r.returncode != 0
    assert f"no DVC remote to push to: {bare / '.dvc' / 'config'} sets no default remote" in out, out[-3000:]
    assert "configured remotes: none" in out
    assert "dvc repro" not in out and not (bare / "dvc.lock").exists() and not (bare / "data").exists()
    r = subprocess.run(["dvc", "push"], cwd=bare, env=env, capture_output=True, text=True, timeout=120)
    assert r.returncode != 0 and "no remote specified" in r.stderr, r.stderr


def test_forced_rerun_of_a_finished_stage_resumes_it(repo):
    repo, env, _, first = repo
    _sh(["dvc", "repro", "-f", "-s", "evolve"], repo, env)
    metrics = json.loads((repo / "reports/metrics/evolve.json").read_text())
    assert metrics["resumed_from_generation"] == metrics["generations"] == 2 and metrics["calls_made"] == 0
    after = json.loads((repo / "data/checkpoints/coordinator.json").read_text())
    assert after["saved_fitness"] == first["saved_fitness"] and after["run_fingerprint"] == first["run_fingerprint"]
    _sh(["dvc", "repro", "-f", "-s", "evaluate"], repo, env)
    res = json.loads((repo / "data/eval/results.json").read_text())
    assert res["pool_calls"] == 0 and res["judge"]["calls_new"] == 0  # the judge's verdicts come from the store


def test_evolve_param_change_reruns_evolve_and_downstream_only(repo):
    repo, env, _, first = repo
    params = yaml.safe_load((repo / "params.yaml").read_text())
    params["evolve"]["generations"] = 1  # generation 0 is the same run: every call is already stored
    (repo / "params.yaml").write_text(yaml.safe_dump(params, sort_keys=False))
    try:
        out = _sh(["dvc", "repro"], repo, env)
        ran = {s for s in ("prepare", "encode", "evolve", "router", "evaluate", "report")
               if f"Running stage '{s}'" in out}
        assert ran == {"evolve", "router", "evaluate", "report"}  # the router trains on the evolve budget too
        assert json.loads((repo / "reports/metrics/evolve.json").read_text())["calls_made"] == 0
        assert json.loads((repo / "reports/metrics/router.json").read_text())["calls_made"] == 0
    finally:
        params["evolve"]["generations"] = 2
        (repo / "params.yaml").write_text(yaml.safe_dump(params, sort_keys=False))


def test_code_edit_reruns_evolve_as_a_new_run_from_stored_calls(repo):
    """Edit the reward shaping (a change of code, not of behaviour: `/ 4` → `/ 4.0`): DVC sees the dep change,
    and evolve trains again from generation 0 — the old pickle no longer matches — paying no LLM call."""
    repo, env, _, first = repo
    episode = repo / "src/trinity/coordinator/episode.py"
    original = episode.read_text()
    edited = original.replace("((max(n_turns, 1) - 1) / max_turns) / 4", "((max(n_turns, 1) - 1) / max_turns) / 4.0", 1)
    assert edited != original
    episode.write_text(edited)
    try:
        out = _sh(["dvc", "repro"], repo, env)
        ran = {s for s in ("prepare", "encode", "evolve", "router", "evaluate", "report")
               if f"Running stage '{s}'" in out}
        assert {"evolve", "router", "evaluate", "report"} <= ran and "prepare" not in ran
        metrics = json.loads((repo / "reports/metrics/evolve.json").read_text())
        assert metrics["resumed_from_generation"] == 0 and metrics["generations"] == 2
        assert metrics["calls_made"] == 0 and metrics["store_hits"] > 0
        after = json.loads((repo / "data/checkpoints/coordinator.json").read_text())
        assert after["code_version"] != first["code_version"] and after["run_fingerprint"] != first["run_fingerprint"]
        assert after["saved_fitness"] == first["saved_fitness"]  # same behaviour, same stored samples: same result
    finally:
        episode.write_text(original)


@pytest.mark.slow
def test_optimiser_ablation_as_dvc_experiments(repo, tmp_path):
    """The ablation as `make ablation` runs it, on two methods: one experiment per method (`dvc exp run --temp -S
    evolve.method=...`), each in a temporary copy of the workspace, one after the other, compared in `dvc exp show
    --json` (each with its training and evaluation metrics, from its commit), tabulated by
    scripts/ablation_report.py. The experiments share the workspace's response store, named by TRINITY_STORE:
    their evolve runs are recorded in it. (Not DVC's celery queue: its worker hangs after one or two experiments, treeverse/dvc#10428.)"""
    import duckdb

    repo, env, _, _ = repo
    store = repo / "data/store/trinity.duckdb"

    def evolve_runs() -> set[str]:
        with duckdb.connect(str(store), read_only=True) as db:
            return {r for (r,) in db.execute("SELECT DISTINCT run_id FROM episodes").fetchall()}

    runs_before = evolve_runs()
    checkpoint = (repo / "data/checkpoints/coordinator.json").read_text()
    _sh(["git", "add", "-A"], repo, env)
    _sh(["git", "commit", "-q", "--allow-empty", "-m", "baseline"], repo, env)
    methods = ("reinforce", "random_search")
    ran = ""
    for m in methods:
        ran += _sh(["dvc", "exp", "run", "--temp", "--name", f"ablation-{m}", "-S", f"evolve.method={m}"], repo,
                   {**env, "TRINITY_STORE": str(store)}, timeout=1800)  # as `make ablation` names it
    listed = _sh(["dvc", "exp", "list", "--name-only"], repo, env).split()
    assert {f"ablation-{m}" for m in methods} <= set(listed), listed  # what `make ablation` checks to skip one
    # outside the workspace: its own outputs are untouched
    assert (repo / "data/checkpoints/coordinator.json").read_text() == checkpoint
    r = subprocess.run(["dvc", "exp", "show", "--json"], cwd=repo, env=env, capture_output=True, text=True,
                       timeout=300)
    assert r.returncode == 0, r.stderr
    shown = json.loads(r.stdout)
    sys.path.insert(0, str(PROJECT_ROOT / "scripts"))
    from ablation_report import ablation_rows, experiments, render

    exps = experiments(shown)
    rows = {r["method"]: r for r in ablation_rows(exps, "ablation-")}
    assert set(rows) == set(methods), ran[-3000:]
    for m, r in rows.items():
        assert r["name"] == f"ablation-{m}" and r["evolve"]["generations"] == 2
        assert {"avg_in_distribution", "math500", "gsm8k"} <= set(r["trinity"])  # the experiment's evaluation
        assert isinstance(r["evolve"]["saved_fitness"], float)
    assert rows["reinforce"]["budget"] == rows["random_search"]["budget"]
    assert len(evolve_runs() - runs_before) >= 2  # each experiment's training went to the workspace's store
    md = render(list(rows.values()))
    # experiments on different budgets are no ablation: refused, naming them
    unequal = [json.loads(json.dumps(e)) for e in exps]
    for e in unequal:
        if e["name"] == "ablation-reinforce":
            e["params"]["params.yaml"]["evolve"]["generations"] = 7
    with pytest.raises(SystemExit, match="do not share one budget.*ablation-reinforce"):
        ablation_rows(unequal, "ablation-")
    assert "| ablation-reinforce | REINFORCE |" in md and "| ablation-random_search | random search |" in md
    table = _sh(["dvc", "exp", "show", "--only-changed", "--no-pager"], repo, env)
    assert "ablation-reinforce" in table and "ablation-random_search" in table
    print(f"\n[dvc] exp show --only-changed:\n{table}\n{md}")
