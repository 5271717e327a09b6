"""Expansion on an engine: one generation whose never-seen nodes run as Prefect tasks on a Dask LocalCluster
of 2 worker processes gives exactly the thread runner's generation (same fitness, same paths, same calls)
on the real SmolLM2; the workers load the model once each and never open the store."""
import os

import numpy as np

from trinity.config import Settings
from trinity.coordinator.episode import StateCache
from trinity.pool.task_runner import TaskRunnerExecutor, run_expanding
from trinity.evolve.loop import evolve
from trinity.store import Store

from fixtures.tiny_setup import ARITHMETIC_TASKS, SHORT_COORDINATOR, SMOL_PAIR_POOL

SETTINGS = {
    "pool": {**SMOL_PAIR_POOL, "dask_workers": 2},
    "coordinator": SHORT_COORDINATOR,
    "evolve": {"generations": 1, "popsize": 6, "episodes_per_candidate": 2, "sigma0": 0.5},
}
TASKS = ARITHMETIC_TASKS[:2]


def test_dask_generation_equals_thread_generation(tmp_path):
    from trinity.coordinator.encoder import TranscriptEncoder
    from trinity.grading import grade
    from trinity.pool.runtime import build_pool

    encoder = TranscriptEncoder("smollm2-135m-instruct", max_tokens=384)
    out = {}
    for runner in ("threads", "dask"):
        s = Settings.model_validate({**SETTINGS, "pool": {**SETTINGS["pool"], "task_runner": runner}})
        executor = TaskRunnerExecutor()
        with Store(tmp_path / f"{runner}.duckdb") as store:  # each runner pays for its own calls
            pool = build_pool(s.pool, store, executor=executor)
            res = run_expanding(lambda: evolve(s, TASKS, pool, StateCache(encoder, store), grade, store=store,
                                               run_id="gen"), s.pool, pool)
            rows = store.con.execute("SELECT candidate, task_id, path, reward, correct FROM episodes ORDER BY ALL").fetchall()
            texts = store.con.execute("SELECT key, text FROM responses ORDER BY key").fetchall()
        rec = res.history[0]
        out[runner] = (rows, texts, rec.best_candidate_fitness, rec.saved_fitness, rec.mean_fitness, rec.calls_made, rec.store_hits, res.params)
        assert rec.calls_made > 0 and executor.submitted == rec.calls_made
        if runner == "threads":
            assert set(executor.workers) == {os.getpid()}
        else:
            assert executor.workers and os.getpid() not in executor.workers and len(executor.workers) <= 2
            for info in executor.workers.values():
                assert info["models_loaded"] == ["SmolLM2-135M-Instruct.Q4_1.gguf"]  # once per worker process
                assert not info["duckdb_imported"]  # workers return responses; only this process writes the store
    t, d = out["threads"], out["dask"]
    assert d[:6] == t[:6]
    np.testing.assert_array_equal(d[6], t[6])


def test_task_runner_http_members_reuse_clients_and_keep_the_limits(monkeypatch):
    """HTTP members through the task runner (Prefect threads): the same replies as in process; the pool's limits
    hold (per member, then pool-wide: the main process takes a request's slots until its reply is back); each
    member is built once per process and keeps its client across calls and flows."""
    import asyncio

    from fixtures.fake_openai_server import FakeOpenAIServer

    from trinity.pool.runtime import build_pool
    from trinity.pool.worker import PROCESS_MEMBERS
    from trinity.records import ChatMessage

    monkeypatch.setenv("TRINITY_TEST_FAKE_KEY", "sk-trinitytest-runner")

    def requests(pool, n: int):
        msgs = [[ChatMessage("user", f"question {i}")] for i in range(n)]
        return [pool.request(i % len(pool), m, label="worker") for i, m in enumerate(msgs)]

    with FakeOpenAIServer(latency_s=0.1) as srv:
        def settings(max_concurrency: int, member_concurrency: int) -> Settings:
            members = [{"name": name, "backend": "openai", "model": "m", "base_url": srv.base_url, "max_retries": 0,
                        "api_key_env": "TRINITY_TEST_FAKE_KEY", "max_concurrency": member_concurrency}
                       for name in ("a", "b")]
            return Settings.model_validate({"pool": {"members": members, "max_concurrency": max_concurrency}})

        for max_concurrency, member_concurrency, in_flight in ((8, 2, 4), (3, 4, 3)):
            s = settings(max_concurrency, member_concurrency)
            in_process = build_pool(s.pool, None)
            want = asyncio.run(in_process.complete_many(requests(in_process, 16)))
            srv.max_in_flight = 0
            executor = TaskRunnerExecutor()
            pool = build_pool(s.pool, None, executor=executor)
            got = run_expanding(lambda: asyncio.run(pool.complete_many(requests(pool, 16))), s.pool, pool)
            assert [(r.ok, r.text) for r in got] == [(r.ok, r.text) for r in want] and all(r.ok for r in got)
            assert executor.submitted == 16 and set(executor.workers) == {os.getpid()}
            assert 1 < srv.max_in_flight <= in_flight  # a, b: 2 each (8 allowed in all); then 3 in all (4 each)
            member = PROCESS_MEMBERS.member(s.pool.members[0])
            client = member.client._sdk  # the SDK client of the HTTP loop: one per process and loop
            run_expanding(lambda: asyncio.run(pool.complete_many(requests(pool, 20)[16:])), s.pool, pool)
            assert PROCESS_MEMBERS.member(s.pool.members[0]) is member and member.client._sdk is client
            assert member.totals.calls == 10  # every call of member a in this process, on its one client
