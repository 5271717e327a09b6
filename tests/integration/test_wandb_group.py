"""One W&B group per pipeline run (`trinity.ops.tracking.wandb_group`): every stage of one real `dvc repro` (separate
processes DVC starts) gets the same group, the next repro another; WANDB_RUN_GROUP, then TRINITY_WANDB_GROUP,
override it; a `dvc exp run` is grouped by its experiment's name (DVC_EXP_NAME); the stage flows of one Prefect
pipeline flow run share the root flow run's group."""
import os
import subprocess
import sys
from pathlib import Path

import pytest

from trinity.ops.tracking import DVC_EXP_ENV, GROUP_ENV, WANDB_GROUP_ENV, pipeline_run_id, wandb_group

GROUP_ENVS = (GROUP_ENV, WANDB_GROUP_ENV, DVC_EXP_ENV)

# Each stage prints the group a StageRun of its process would get, into its own DVC output.
DVC_YAML = """stages:
  first:
    cmd: {py} -c "from trinity.ops.tracking import wandb_group; print(wandb_group())" > first.txt
    outs: [first.txt]
  second:
    cmd: {py} -c "from trinity.ops.tracking import wandb_group; print(wandb_group())" > second.txt
    deps: [first.txt]
    outs: [second.txt]
"""


def _sh(cmd, cwd, env):
    r = subprocess.run(cmd, cwd=cwd, env=env, capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, f"{cmd}: {r.stdout}\n{r.stderr}"
    return r.stdout


@pytest.fixture
def dvc_repo(tmp_path):
    env = {k: v for k, v in os.environ.items() if k not in GROUP_ENVS}
    env.update({"PATH": f"{Path(sys.executable).parent}:{env['PATH']}", "DVC_NO_ANALYTICS": "1"})
    (tmp_path / "dvc.yaml").write_text(DVC_YAML.format(py=sys.executable))
    _sh(["git", "init", "-q"], tmp_path, env)
    _sh(["dvc", "init", "-q"], tmp_path, env)
    return tmp_path, env


def _groups(repo: Path) -> tuple[str, str]:
    return (repo / "first.txt").read_text().strip(), (repo / "second.txt").read_text().strip()


def test_the_stages_of_one_dvc_repro_share_a_group_and_the_next_repro_gets_another(dvc_repo):
    repo, env = dvc_repo
    _sh(["dvc", "repro"], repo, env)
    first, second = _groups(repo)
    assert first == second and first.startswith("dvc-"), (first, second)
    assert first != wandb_group()  # this (pytest) process is not that repro

    _sh(["dvc", "repro", "-f"], repo, env)  # the next repro: both stages again, in a new group
    again = _groups(repo)
    assert again[0] == again[1] and again[0].startswith("dvc-") and again[0] != first

    _sh(["dvc", "repro", "-f"], repo, {**env, GROUP_ENV: "nightly-42"})  # the user's name wins
    assert _groups(repo) == ("nightly-42", "nightly-42")
    _sh(["dvc", "repro", "-f"], repo, {**env, WANDB_GROUP_ENV: "sweep-7", GROUP_ENV: "nightly-42"})  # W&B's own first
    assert _groups(repo) == ("sweep-7", "sweep-7")


def test_a_dvc_experiment_is_grouped_by_its_name(dvc_repo):
    """`dvc exp run --name` gives every stage DVC_EXP_NAME: the experiment is the group."""
    repo, env = dvc_repo
    _sh(["git", "add", "-A"], repo, env)
    _sh(["git", "-c", "user.name=t", "-c", "user.email=t@t", "commit", "-q", "-m", "init"], repo, env)
    _sh(["dvc", "exp", "run", "--name", "ablation-x"], repo, env)
    assert _groups(repo) == ("exp-ablation-x", "exp-ablation-x")


def test_outside_dvc_and_prefect_a_process_is_its_own_run(monkeypatch):
    for name in GROUP_ENVS:
        monkeypatch.delenv(name, raising=False)
    group = wandb_group()
    assert group == pipeline_run_id() and group.startswith("proc-") and group.endswith(f"-{os.getpid()}")
    monkeypatch.setenv(GROUP_ENV, "  my-sweep ")
    assert wandb_group() == "my-sweep"
    monkeypatch.setenv(GROUP_ENV, "it's = a/run")  # a name a report's run-set filter can hold
    assert wandb_group() == "it-s-a-run"


def test_the_stage_flows_of_one_pipeline_flow_run_share_its_group(monkeypatch):
    for name in GROUP_ENVS:
        monkeypatch.delenv(name, raising=False)
    from prefect import flow

    @flow(name="stage-like")
    def stage_like() -> str:
        return wandb_group()

    @flow(name="pipeline-like")
    def pipeline_like() -> tuple[str, str, str]:
        from prefect.runtime import flow_run

        return stage_like(), stage_like(), str(flow_run.id)

    a, b, root = pipeline_like()
    assert a == b == f"prefect-{root}"
    c, _, root2 = pipeline_like()
    assert c == f"prefect-{root2}" != a
