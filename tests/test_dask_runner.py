"""Expansion on an engine: one generation whose never-seen nodes run as Prefect tasks on a Dask LocalCluster
of 2 worker processes gives exactly the thread runner's generation (same fitness, same paths, same calls)
on the real SmolLM2; the workers load the model once each and never open the store."""
import os

import numpy as np

from trinity.config import Settings
from trinity.coordinator.episode import StateCache
from trinity.evolve.engine import TaskRunnerExpansion, run_expanding
from trinity.evolve.sep_cma import evolve
from trinity.store import Store

from tiny_setup import ARITHMETIC_TASKS, ROLE_CAPS, SHORT_COORDINATOR, SMOL_PAIR_POOL

SETTINGS = {
    "pool": SMOL_PAIR_POOL,
    "coordinator": SHORT_COORDINATOR,
    "evolve": {"generations": 1, "popsize": 6, "episodes_per_candidate": 2, "sigma0": 0.5, "dask_workers": 2},
}
TASKS = ARITHMETIC_TASKS[:2]


def test_dask_generation_equals_thread_generation(tmp_path):
    from trinity.coordinator.encoder import TranscriptEncoder
    from trinity.grading import grade
    from trinity.pool.runtime import build_pool

    encoder = TranscriptEncoder("smollm2-135m-instruct", max_tokens=384)
    out = {}
    for runner in ("threads", "dask"):
        s = Settings.model_validate({**SETTINGS, "evolve": {**SETTINGS["evolve"], "task_runner": runner}})
        expansion = TaskRunnerExpansion()
        with Store(tmp_path / f"{runner}.duckdb") as store:  # each runner pays for its own calls
            pool = build_pool(s.pool, store, ROLE_CAPS)
            res = run_expanding(lambda: evolve(s, TASKS, pool, StateCache(encoder, store), grade, store=store,
                                               run_id="gen"), s, pool, task_runner=True, expansion=expansion)
            rows = store.con.execute("SELECT candidate, task_id, path, reward, correct FROM episodes ORDER BY ALL").fetchall()
            texts = store.con.execute("SELECT key, text FROM responses ORDER BY key").fetchall()
        rec = res.history[0]
        out[runner] = (rows, texts, rec.best_candidate_fitness, rec.saved_fitness, rec.mean_fitness, rec.calls_made, rec.store_hits, res.params)
        assert rec.calls_made > 0 and expansion.submitted == rec.calls_made
        if runner == "threads":
            assert set(expansion.workers) == {os.getpid()}
        else:
            assert expansion.workers and os.getpid() not in expansion.workers and len(expansion.workers) <= 2
            for info in expansion.workers.values():
                assert info["models_loaded"] == ["SmolLM2-135M-Instruct.Q4_1.gguf"]  # once per worker process
                assert not info["duckdb_imported"]  # workers return responses; only this process writes the store
    t, d = out["threads"], out["dask"]
    assert d[:6] == t[:6]
    np.testing.assert_array_equal(d[6], t[6])
