"""`dvc plots show` in a fresh clone, before any `dvc pull`: every file a top-level plot reads is in git (like the
stages' metrics), so DVC renders the fitness curve from the commit alone, and the rest of data/ stays out of git."""
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import yaml

PROJECT = Path(__file__).resolve().parents[2]


def _dvc_yaml() -> dict:
    return yaml.safe_load((PROJECT / "dvc.yaml").read_text())


def _plot_files(doc: dict) -> set[str]:
    """The files the top-level `plots:` read: a plain path, or the keys of a plot definition's `y`."""
    files = set()
    for entry in doc["plots"]:
        if isinstance(entry, str):
            files.add(entry)
            continue
        (definition,) = entry.values()
        y = definition.get("y") if isinstance(definition, dict) else None
        files |= set(y) if isinstance(y, dict) else {next(iter(entry))}
    return files


def _outs(doc: dict) -> dict[str, dict]:
    outs = {}
    for stage in doc["stages"].values():
        for kind in ("outs", "metrics", "plots"):
            for o in stage.get(kind, []):
                path, opts = (o, {}) if isinstance(o, str) else next(iter(o.items()))
                outs[path] = opts or {}
    return outs


def test_every_plotted_file_is_a_git_file_not_dvc_cache():
    doc = _dvc_yaml()
    outs = _outs(doc)
    for path in _plot_files(doc):
        if path in outs:  # a stage output: kept in git (cache: false), or a fresh clone has nothing to plot
            assert outs[path].get("cache") is False, f"dvc.yaml plots read {path}, a DVC-cached output"


def _sh(cmd, cwd, env):
    r = subprocess.run(cmd, cwd=cwd, env=env, capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, f"{cmd} failed ({r.returncode}):\n{r.stdout[-3000:]}\n{r.stderr[-3000:]}"
    return r.stdout


def test_a_fresh_clone_shows_the_fitness_plot_without_a_pull(tmp_path):
    env = {**os.environ, "PATH": f"{Path(sys.executable).parent}:{os.environ['PATH']}", "DVC_NO_ANALYTICS": "1",
           "GIT_AUTHOR_NAME": "t", "GIT_AUTHOR_EMAIL": "t@t", "GIT_COMMITTER_NAME": "t", "GIT_COMMITTER_EMAIL": "t@t"}
    repo = tmp_path / "repo"
    repo.mkdir()
    _sh(["git", "init", "-q"], repo, env)
    _sh(["dvc", "init", "-q"], repo, env)
    for f in ("dvc.yaml", "params.yaml", ".gitignore"):  # the project's pipeline, its params and its git-ignores
        shutil.copy(PROJECT / f, repo / f)
    (repo / "reports").mkdir()
    shutil.copytree(PROJECT / "reports" / "plots", repo / "reports" / "plots")
    # what a run leaves under data/: the fitness history (two generations) beside outputs DVC's cache carries
    history = [{"generation": g, "saved_fitness": 0.1 * g, "mean_fitness": 0.05 * g,
                "best_candidate_fitness": 0.2 * g} for g in (0, 1)]
    (repo / "data" / "evolve").mkdir(parents=True)
    (repo / "data" / "evolve" / "history.json").write_text(json.dumps(history))
    (repo / "data" / "checkpoints").mkdir()
    (repo / "data" / "checkpoints" / "coordinator.json").write_text("{}")
    _sh(["git", "add", "-A"], repo, env)
    _sh(["git", "commit", "-q", "-m", "a run"], repo, env)
    clone = tmp_path / "clone"
    _sh(["git", "clone", "-q", str(repo), str(clone)], tmp_path, env)
    assert (clone / "data/evolve/history.json").is_file()
    assert not (clone / "data/checkpoints/coordinator.json").exists()  # the rest of data/ is DVC's, not git's

    shown = json.loads(_sh(["dvc", "plots", "show", "--json", "-o", str(tmp_path / "plots")], clone, env))
    assert "errors" not in shown, shown.get("errors")
    (fitness,) = [v for k, v in shown["data"].items() if k.startswith("Fitness per generation")]
    (plot,) = fitness
    values = plot["content"]["data"]["values"]
    assert {(v["generation"], v["field"], v["dvc_inferred_y_value"]) for v in values} == {
        (row["generation"], field, row[field]) for row in history
        for field in ("saved_fitness", "mean_fitness", "best_candidate_fitness")}


def test_weekly_retrain_commits_every_output_kept_in_git():
    """An output in git (`cache: false`) is pipeline state: weekly-retrain's proposal commits it with dvc.lock (a
    lock naming a history the commit lacks would be a lie), and a fast-forward may replace it."""
    from trinity.ops.git_checkout import PIPELINE_STATE_PATHS, is_pipeline_state

    in_git = sorted(p for p, opts in _outs(_dvc_yaml()).items() if opts.get("cache") is False)
    assert "data/evolve/history.json" in in_git
    assert [p for p in in_git if not is_pipeline_state(p)] == []
    plain = [s for s in PIPELINE_STATE_PATHS if not s.startswith(":")]  # git pathspecs: a file or a directory
    assert [p for p in in_git if not any(p == s or p.startswith(s + "/") for s in plain)] == []
