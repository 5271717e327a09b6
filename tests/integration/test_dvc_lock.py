"""The committed dvc.lock is this code's: every dependency of every stage that lives in the checkout (code, flows,
params) has, in dvc.lock, the hash of the file as committed. A change to a stage's code without a replay of the
pipeline (`dvc repro`, minutes from the store) fails here, so the committed `reports/` and `dvc.lock` never
describe other code than the code beside them.

Run on a copy of the checkout's git-tracked files (what a clean clone holds: no data, no store), with `dvc status
--json`: DVC's own hashing, not ours. Data dependencies (data/…, the benchmark directory) are not in a clone and
are left out; everything git tracks is checked.
"""
from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

PROJECT_ROOT = Path(__file__).resolve().parents[2]
DVC = str(Path(sys.executable).with_name("dvc"))


def _tracked_files(root: Path) -> list[str]:
    out = subprocess.run(["git", "ls-files", "-z"], cwd=root, capture_output=True, text=True, check=True).stdout
    return [p for p in out.split("\0") if p and (root / p).is_file()]


def _copy_tracked(root: Path, dest: Path) -> list[str]:
    files = _tracked_files(root)
    for rel in files:
        if rel.startswith(".dvc/"):
            continue
        target = dest / rel
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(root / rel, target)
    return files


def stale_dependencies(status: dict, tracked: set[str]) -> dict[str, dict]:
    """From `dvc status --json`: per stage, the changed dependencies that are git-tracked (a file, or a
    directory holding tracked files), changed params, a changed command; data outside git is left out."""
    def in_git(path: str) -> bool:
        p = path.rstrip("/")
        return p in tracked or any(t.startswith(p + "/") for t in tracked)

    stale: dict[str, dict] = {}
    for stage, changes in status.items():
        for change in changes:
            if not isinstance(change, dict):  # "changed command", "always changed"
                stale.setdefault(stage, {})[str(change)] = True
                continue
            for path, what in (change.get("changed deps") or {}).items():
                if in_git(path):
                    stale.setdefault(stage, {})[path] = what
    return stale


def test_stale_dependencies_reads_dvc_status_deps_only():
    """The reading of `dvc status --json` itself: data deps and outputs are not counted, code and params are."""
    status = {"evolve": [{"changed deps": {"src/trinity/pool": "modified", "data/prepared/train.jsonl": "deleted",
                                           "params.yaml": {"evolve.seed": "modified"}}},
                         {"changed outs": {"data/evolve/history.json": "deleted"}}],
              "report": [{"changed outs": {"reports/summary.md": "modified"}}],
              "prepare": ["changed command"]}
    tracked = {"src/trinity/pool/local.py", "params.yaml", "reports/summary.md"}
    assert stale_dependencies(status, tracked) == {
        "evolve": {"src/trinity/pool": "modified", "params.yaml": {"evolve.seed": "modified"}},
        "prepare": {"changed command": True}}


def test_committed_dvc_lock_matches_the_checkout(tmp_path):
    if not (PROJECT_ROOT / ".git").exists():
        pytest.skip("not a git checkout")
    repo = tmp_path / "clone"
    tracked = set(_copy_tracked(PROJECT_ROOT, repo))
    assert "dvc.lock" in tracked, "dvc.lock is not committed"
    env = {**os.environ, "DVC_NO_ANALYTICS": "1"}
    subprocess.run([DVC, "init", "--no-scm", "-q"], cwd=repo, env=env, check=True, capture_output=True)
    r = subprocess.run([DVC, "status", "--json"], cwd=repo, env=env, capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr
    status = json.loads(r.stdout or "{}")
    stale = stale_dependencies(status, tracked)
    assert not stale, (
        "the committed dvc.lock was not written by this code: these stage dependencies differ from it "
        f"(replay the pipeline: `dvc repro`, then commit dvc.lock and reports/): {json.dumps(stale, indent=1)}")



def test_report_stage_reads_only_its_declared_dependencies(tmp_path):
    """The report stage's outputs come from its dvc.yaml deps only: it runs with no response store at all (it
    used to export the store, which it did not depend on, to data/exports/; that is `trinity export` now), and
    declares no output under data/exports."""
    import yaml

    from test_results_integrity import _report_inputs, settings
    from trinity.stages import paths as stage_paths, run_stage

    paths = stage_paths.Paths(tmp_path)
    _report_inputs(paths)
    out = run_stage("report", settings(), paths)
    assert Path(out["summary"]).is_file()
    assert not paths.store.exists() and not paths.exports.exists()
    report = yaml.safe_load((PROJECT_ROOT / "dvc.yaml").read_text())["stages"]["report"]
    assert not any("exports" in (o if isinstance(o, str) else next(iter(o))) for o in report["outs"])
