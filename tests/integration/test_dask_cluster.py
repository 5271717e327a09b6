"""Expansion on an existing Dask cluster: `dask scheduler` and two `dask worker` processes started here as real
processes (under tests/fixtures/process_supervisor.py, so none outlives the test) run one generation whose
parameters are exactly the in-process thread runner's; the workers never open the store, report to this process's Prefect API
(none starts an API server of its own), and are all gone at the end. An unreachable scheduler fails at once,
naming the address and the key, before any model is called."""
import json
import os
import socket
import sys
import time
from pathlib import Path

import numpy as np
import psutil
import pytest

from trinity.config import ConfigError, Settings, load_settings
from trinity.coordinator.episode import StateCache
from trinity.pool.task_runner import DaskClusterError, TaskRunnerExecutor, run_expanding
from trinity.evolve.loop import evolve
from trinity.store import Store

from fixtures.process_supervisor import Supervisor, alive
from fixtures.tiny_setup import ARITHMETIC_TASKS, SHORT_COORDINATOR, SMOL_PAIR_POOL

SETTINGS = {  # test_dask_runner's tiny generation, smaller: 4 candidates x 1 task, the saved vector on 1 episode
    "pool": SMOL_PAIR_POOL,
    "coordinator": SHORT_COORDINATOR,
    "evolve": {"generations": 1, "popsize": 4, "episodes_per_candidate": 1, "sigma0": 0.5, "saved_fitness_tasks": 1,
               "saved_fitness_samples": 1},
}
TASKS = ARITHMETIC_TASKS[:2]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _cmdline(pid: int) -> str:
    try:
        return " ".join(psutil.Process(pid).cmdline())
    except psutil.Error:
        return ""


@pytest.fixture
def cluster(tmp_path):
    """A scheduler on a free port of 127.0.0.1 and two single-threaded workers (the venv's `dask` CLI, this
    process's environment but PREFECT_API_URL); yields (address, supervisor, log dir)."""
    from distributed import Client

    bin_dir = Path(sys.executable).parent
    env = {k: v for k, v in os.environ.items() if k != "PREFECT_API_URL"}
    env["PATH"] = f"{bin_dir}:{env.get('PATH', '')}"
    address = f"tcp://127.0.0.1:{_free_port()}"
    sup = Supervisor()
    try:
        sup.start("scheduler", [str(bin_dir / "dask"), "scheduler", "--host", "127.0.0.1", "--port",
                                address.rsplit(":", 1)[1], "--no-dashboard"], env, str(tmp_path), str(tmp_path / "scheduler.log"))
        for i in range(2):
            sup.start(f"worker-{i}", [str(bin_dir / "dask"), "worker", address, "--nthreads", "1", "--nworkers", "1",
                                      "--host", "127.0.0.1", "--no-dashboard", "--name", f"w{i}"],
                      env, str(tmp_path), str(tmp_path / f"worker-{i}.log"))
        with Client(address, timeout=60, set_as_default=False) as client:
            client.wait_for_workers(2, timeout=120)
        yield address, sup, tmp_path
    finally:
        sup.descendants()
        sup.stop()
        left = alive(sup.seen)
        assert left == [], f"processes left behind: {[(p, _cmdline(p)) for p in left]}"


@pytest.mark.slow  # two real generations (threads, then the cluster): 197-286 s measured on 2 shared cores (load 8-15)
def test_existing_cluster_generation_equals_thread_generation(cluster, tmp_path):
    from distributed import Client

    from trinity.coordinator.encoder import TranscriptEncoder
    from trinity.grading import grade
    from trinity.pool.runtime import build_pool

    address, sup, logs = cluster
    encoder = TranscriptEncoder("smollm2-135m-instruct", max_tokens=384)
    out, wall = {}, {}
    for runner in ("threads", "cluster"):
        pool_settings = {**SETTINGS["pool"], "task_runner": "threads" if runner == "threads" else "dask"}
        if runner == "cluster":
            pool_settings["dask_address"] = address
        s = Settings.model_validate({**SETTINGS, "pool": pool_settings})
        executor = TaskRunnerExecutor()
        store_path = tmp_path / f"{runner}.duckdb"
        t0 = time.monotonic()
        with Store(store_path) as store:  # each runner pays for its own calls
            pool = build_pool(s.pool, store, executor=executor)
            res = run_expanding(lambda: evolve(s, TASKS, pool, StateCache(encoder, store), grade, store=store,
                                               run_id="gen"), s.pool, pool)
            rows = store.con.execute("SELECT candidate, task_id, path, reward, correct FROM episodes ORDER BY ALL").fetchall()
            texts = store.con.execute("SELECT key, text FROM responses ORDER BY key").fetchall()
        wall[runner] = time.monotonic() - t0
        print(f"\n{runner}: {wall[runner]:.1f} s", flush=True)
        rec = res.history[0]
        out[runner] = (rows, texts, rec.best_candidate_fitness, rec.saved_fitness, rec.mean_fitness, rec.calls_made,
                       rec.store_hits, res.params)
        assert rec.calls_made > 0 and executor.submitted == rec.calls_made
        if runner == "cluster":
            with Client(address, timeout=30, set_as_default=False) as client:
                # every worker process: what it has loaded and holds open, after the generation
                seen = client.run(lambda: {"pid": os.getpid(), "duckdb": "duckdb" in sys.modules,
                                           "open": [f.path for f in psutil.Process().open_files()]})
            worker_pids = {w["pid"] for w in seen.values()}
            assert len(worker_pids) == 2 and set(executor.workers) <= worker_pids, (executor.workers, worker_pids)
            assert set(executor.workers) & set(sup.descendants())  # the calls ran in the processes started here
            for info in executor.workers.values():
                assert info["models_loaded"] == ["SmolLM2-135M-Instruct.Q4_1.gguf"]  # once per worker process
            for addr, w in seen.items():  # one writer: no worker ever imported DuckDB or holds the store open
                assert not w["duckdb"], addr
                assert not [p for p in w["open"] if ".duckdb" in p], (addr, w["open"])
            # the workers reported to this process's Prefect API: none started an API server of its own
            servers = [p for p in sup.descendants() if "uvicorn" in _cmdline(p)]
            assert servers == [], [_cmdline(p) for p in servers]
    t, c = out["threads"], out["cluster"]
    assert c[:7] == t[:7]
    np.testing.assert_array_equal(c[7], t[7])
    print(f"\nwall time of one generation: threads {wall['threads']:.1f} s, existing cluster {wall['cluster']:.1f} s "
          f"({t[5]} calls each)")


def test_unreachable_scheduler_fails_before_any_call(tmp_path):
    address = f"tcp://127.0.0.1:{_free_port()}"  # nothing listens there
    s = Settings.model_validate({**SETTINGS, "pool": {**SETTINGS["pool"], "task_runner": "dask",
                                                       "dask_address": address}})
    called = []

    class NoPool:
        executor = TaskRunnerExecutor()

    t0 = time.monotonic()
    with pytest.raises(DaskClusterError) as e:
        run_expanding(lambda: called.append(1), s.pool, NoPool())
    assert time.monotonic() - t0 < 30
    assert f"pool.dask_address: no Dask scheduler answers at {address}" in str(e.value)
    assert called == []


def test_malformed_address_is_a_config_error_naming_the_key(tmp_path):
    import yaml

    params = tmp_path / "params.yaml"
    params.write_text(yaml.safe_dump({**SETTINGS, "pool": {**SETTINGS["pool"], "task_runner": "dask",
                                                            "dask_address": "127.0.0.1:8786"}}))
    with pytest.raises(ConfigError) as e:
        load_settings(params)
    assert str(params) in str(e.value) and "pool.dask_address must be a scheduler address like" in str(e.value)
    assert "'127.0.0.1:8786'" in str(e.value)
    s = Settings.model_validate({**SETTINGS, "pool": {**SETTINGS["pool"], "task_runner": "dask",
                                                       "dask_address": "tcp://127.0.0.1:8786"}})
    # runtime only: where calls run is no part of a run's identity (params hash, run id)
    assert s.params_hash() == Settings.model_validate(SETTINGS).params_hash()


def test_a_port_that_is_no_scheduler_or_has_no_worker_fails_fast(tmp_path):
    """A port that accepts connections but speaks no Dask (as a scheduler's HTTP port 8787 does: a Dask Client
    waits there forever), and a real scheduler without a worker: errors naming the address, within the deadline."""
    from trinity.pool.task_runner import check_scheduler

    with socket.socket() as silent:  # accepts (the kernel's backlog), never answers
        silent.bind(("127.0.0.1", 0))
        silent.listen()
        address = f"tcp://127.0.0.1:{silent.getsockname()[1]}"
        t0 = time.monotonic()
        with pytest.raises(DaskClusterError, match=f"no Dask scheduler answers at {address}"):
            check_scheduler(address, timeout=2)
        assert time.monotonic() - t0 < 10
    bin_dir = Path(sys.executable).parent
    address = f"tcp://127.0.0.1:{_free_port()}"
    with Supervisor() as sup:
        sup.start("scheduler", [str(bin_dir / "dask"), "scheduler", "--host", "127.0.0.1", "--port",
                                address.rsplit(":", 1)[1], "--no-dashboard"], dict(os.environ), str(tmp_path),
                  str(tmp_path / "scheduler.log"))
        deadline = time.monotonic() + 60
        while True:  # until the scheduler listens
            try:
                check_scheduler(address, timeout=2)
            except DaskClusterError as e:
                message = str(e)
                if "has no worker" in message:
                    break
                assert time.monotonic() < deadline, message
            else:
                pytest.fail("a scheduler without workers passed the check")
        assert f"pool.dask_address: the Dask scheduler at {address} has no worker (waited 2 s)" in message
        sup.descendants()
    assert alive(sup.seen) == []


def _sh(cmd, cwd, env, timeout=900) -> str:
    import subprocess

    r = subprocess.run(cmd, cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout)
    assert r.returncode == 0, f"{cmd} failed ({r.returncode}):\n{r.stdout[-4000:]}\n{r.stderr[-4000:]}"
    return r.stdout + r.stderr


@pytest.mark.slow  # prepare + encode + evolve twice (threads, then the cluster), as `dvc repro` runs them: ~4-6 min
def test_dvc_repro_evolve_on_the_cluster_equals_threads(cluster, tmp_path, root):
    """What `dvc repro` / `dvc exp run -S pool.task_runner=dask -S pool.dask_address=...` runs: `python
    flows/evolve.py` — a flow script whose stage task runs inside a real (offline) W&B run — in a copy of the
    checkout with its own src/ (as `dvc exp run --temp` makes one), on workers that import the installed trinity.
    Every task the stage submits carries the stage task's Prefect context to the workers, so that context must
    unpickle there (a function of flows/ does not; a W&B run does not pickle). The checkpoint equals the thread
    runner's, from the same calls paid again on a fresh store."""
    import shutil

    import yaml
    from distributed import Client

    from trinity.config import PROJECT_ROOT

    address, sup, _ = cluster
    project = tmp_path / "project"
    project.mkdir()
    for item in ("dvc.yaml", "flows", "src", "benchmarks"):
        src = PROJECT_ROOT / item
        (shutil.copytree(src, project / item, ignore=shutil.ignore_patterns("__pycache__", "*.egg-info"))
         if src.is_dir() else shutil.copy(src, project / item))
    tiny = {**SETTINGS, "data": {"root": str(root), "train": {"math500": 2}, "in_distribution": {"math500": 1},
                                 "heldout": {"gsm8k": 1}, "math500_max_level": 1}}
    (project / "params.yaml").write_text(yaml.safe_dump(tiny))
    full = load_settings(project / "params.yaml").model_dump(exclude={"source_path"})  # DVC wants every key
    (project / "params.yaml").write_text(yaml.safe_dump(full, sort_keys=False))
    env = {k: v for k, v in os.environ.items() if k not in ("TRINITY_DATA_DIR", "PREFECT_API_URL")}
    env.update({"PATH": f"{Path(sys.executable).parent}:{env['PATH']}", "PREFECT_HOME": str(tmp_path / "prefect"),
                "WANDB_MODE": "offline", "WANDB_DIR": str(tmp_path / "wandb")})
    _sh(["git", "init", "-q"], project, env)
    _sh(["dvc", "init", "-q"], project, env)
    checkpoint = project / "data/checkpoints/coordinator.npy"

    out = _sh(["dvc", "repro", "evolve"], project, env)
    assert "Running stage 'evolve'" in out
    threads = np.load(checkpoint)
    metrics = json.loads((project / "reports/metrics/evolve.json").read_text())

    shutil.rmtree(project / "data/store")  # every call paid again, now on the cluster
    full["pool"].update(task_runner="dask", dask_address=address)
    (project / "params.yaml").write_text(yaml.safe_dump(full, sort_keys=False))
    # where the calls run is a runtime-only setting: DVC sees nothing to re-run, so this stage is forced
    assert "Data and pipelines are up to date." in _sh(["dvc", "status", "evolve"], project, env)
    out = _sh(["dvc", "repro", "-f", "-s", "evolve"], project, env)
    assert "Running stage 'evolve'" in out and "Running stage 'encode'" not in out
    np.testing.assert_array_equal(np.load(checkpoint), threads)
    on_cluster = json.loads((project / "reports/metrics/evolve.json").read_text())
    same = ("calls_made", "store_hits", "saved_fitness", "best_candidate_fitness", "failed_calls")
    assert {k: on_cluster[k] for k in same} == {k: metrics[k] for k in same} and metrics["calls_made"] > 0
    with Client(address, timeout=30, set_as_default=False) as client:
        loaded = client.run(lambda: __import__("trinity.pool.local", fromlist=["LLAMA_MODELS"]).LLAMA_MODELS.loads)
    # the calls ran in the workers started here (the stage's own process loads no model under dask)
    assert any(loaded.values()), loaded
    assert "ModuleNotFoundError" not in out and "Can't pickle" not in out
