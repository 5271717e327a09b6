"""Where a pool's never-seen requests run: in process, or as Prefect task runs on a task runner.

Every stage that calls the pool (evolve, router, evaluate) walks rollout trees whose stored nodes cost nothing;
each step, the requests that no stored response answers (across the whole step, deduplicated) are *expanded*.
Under Prefect, every such request is a task run (`expand-node`) on the task runner named by `pool.task_runner`:

- "threads": Prefect's ThreadPoolTaskRunner in this process (max_workers = pool.max_concurrency);
- "dask":    prefect-dask's DaskTaskRunner, on the existing cluster whose scheduler is `pool.dask_address`
             (checked to answer, with at least one worker, before anything runs), else on a
             distributed.LocalCluster of `pool.dask_workers` worker processes (`dask_threads_per_worker`
             threads each, on 127.0.0.1, no dashboard). Each worker loads the local models it is asked for once
             and keeps them. Workers report their task runs to this process's Prefect API: its URL (the
             ephemeral server's when PREFECT_API_URL is unset) is in the settings context Prefect ships with
             every task, and in a LocalCluster's environment; left alone, each worker would start an ephemeral
             server of its own. The workers of an existing cluster must run this checkout's code (same venv or
             install): a task names `trinity.pool.worker.expand_request`, which they import.

Workers receive plain data (member settings, messages, sampling) and return the response; the main process
prices, counts and stores it (`Pool._record`): DuckDB has one writer, and no worker opens the store.
Results do not depend on the runner: a stored sample is fixed by its request, whoever computed it.
Each worker process builds a member once and keeps it (`trinity.pool.worker.PROCESS_MEMBERS`: a local model
loads once, an HTTP member keeps its client). The pool's concurrency limits hold across workers: this process
takes a request's slots (`pool.max_concurrency` in all, `member.max_concurrency` per HTTP member) before
submitting it and gives them back when its reply is here.

The executor is chosen when the pool is built: `build_pool(..., executor=executor_for(settings.pool))` gives
a `TaskRunnerExecutor` when the task runner is used, else None (in process: `trinity.pool.runtime`'s
`InProcessExecutor`). `run_expanding(fn, settings.pool, pool)` then runs `fn()` (a training loop, an evaluation)
inside a Prefect flow that owns the task runner when the pool's executor is a `TaskRunnerExecutor`, and plainly
otherwise. Whether Prefect is used at all: always for "dask"; for "threads" only when already inside a Prefect
flow (the pipeline's flows), so `trinity stage ...` stays free of Prefect and runs the same calls on asyncio worker
threads.
"""
from __future__ import annotations

import asyncio
import contextlib
import sys
from dataclasses import asdict
from typing import Any, AsyncIterator, Callable, Generic, Sequence, TypeVar

from trinity.config import PoolSettings
from trinity.pool.worker import expand_request
from trinity.records import ChatResponse

T = TypeVar("T")


def in_prefect_flow() -> bool:
    if "prefect" not in sys.modules:  # not imported → certainly not inside a flow run
        return False
    from prefect.context import FlowRunContext

    return FlowRunContext.get() is not None


def use_task_runner(ps: PoolSettings) -> bool:
    return ps.task_runner == "dask" or in_prefect_flow()


def prefect_api_url() -> str:
    """The Prefect API this process talks to: PREFECT_API_URL, else the ephemeral server (started now if it is
    not yet). Dask workers are told this URL; left alone, each would start an ephemeral server of its own."""
    from prefect.settings import PREFECT_API_URL

    url = PREFECT_API_URL.value()
    if url:
        return url
    from prefect.server.api.server import SubprocessASGIServer

    server = SubprocessASGIServer()
    server.start()
    return server.api_url


SCHEDULER_TIMEOUT_S = 10.0
"""How long `check_scheduler` waits for an existing Dask scheduler to answer, and for a worker to join it."""


class DaskClusterError(ValueError):
    """pool.dask_address names no usable cluster: bad input, not an outage to retry (a ValueError, as
    trinity.ops.stage_flow's BAD_INPUT)."""


async def _scheduler_identity(address: str, timeout: float) -> dict:
    """The scheduler's `identity` reply (type, workers, ...), every step under `timeout`: a Dask Client would wait
    forever on a port that accepts connections but speaks no Dask (e.g. the scheduler's HTTP port, 8787)."""
    from distributed.comm import connect

    comm = await asyncio.wait_for(connect(address, timeout=timeout), timeout)
    try:
        await asyncio.wait_for(comm.write({"op": "identity"}), timeout)
        return await asyncio.wait_for(comm.read(), timeout)
    finally:
        comm.abort()


def check_scheduler(address: str, timeout: float = SCHEDULER_TIMEOUT_S) -> int:
    """The number of workers of the scheduler at `address`; raises DaskClusterError, naming the address and the
    key, when no Dask scheduler answers there within `timeout` seconds or no worker joins it within another
    `timeout`."""
    import time

    key = "pool.dask_address"
    deadline = None
    while True:
        try:
            info = asyncio.run(_scheduler_identity(address, timeout))
        except (OSError, asyncio.TimeoutError, TimeoutError) as e:
            raise DaskClusterError(
                f"{key}: no Dask scheduler answers at {address} (waited {timeout:g} s: {type(e).__name__}: {e}). "
                f"Start one (`dask scheduler`, docs/operations.md \"Dask: a pool on an existing cluster\") or clear {key} "
                "for a LocalCluster") from None
        if not isinstance(info, dict) or info.get("type") != "Scheduler":
            raise DaskClusterError(f"{key}: {address} answers, but not as a Dask scheduler ({str(info)[:200]})")
        if info.get("workers"):
            return len(info["workers"])
        deadline = deadline or time.monotonic() + timeout
        if time.monotonic() > deadline:
            raise DaskClusterError(f"{key}: the Dask scheduler at {address} has no worker (waited {timeout:g} s). "
                                   f"Start some: `dask worker {address}`")
        time.sleep(0.5)


def make_task_runner(ps: PoolSettings):
    """The Prefect task runner of `ps.task_runner` (module doc)."""
    if ps.task_runner == "threads":
        from prefect.task_runners import ThreadPoolTaskRunner

        return ThreadPoolTaskRunner(max_workers=max(1, ps.max_concurrency))
    if ps.task_runner == "dask":
        from prefect_dask import DaskTaskRunner

        if ps.dask_address:
            check_scheduler(ps.dask_address)
            return DaskTaskRunner(address=ps.dask_address)
        return DaskTaskRunner(cluster_class="distributed.LocalCluster", cluster_kwargs={
            "n_workers": ps.dask_workers, "threads_per_worker": ps.dask_threads_per_worker, "processes": True,
            "host": "127.0.0.1", "dashboard_address": None, "env": {"PREFECT_API_URL": prefect_api_url()}})
    raise ValueError(f"unknown pool.task_runner {ps.task_runner!r}")


@contextlib.contextmanager
def _api_url_in_settings(ps: PoolSettings):
    """For Dask: this process's Prefect API URL in its settings, which Prefect ships to the workers with every
    task (without it, a worker of an existing cluster would start an ephemeral API server of its own)."""
    from prefect.settings import PREFECT_API_URL, temporary_settings

    if ps.task_runner != "dask" or PREFECT_API_URL.value():
        yield
        return
    with temporary_settings(updates={PREFECT_API_URL: prefect_api_url()}):
        yield


class TaskRunnerExecutor:
    """Runs never-seen requests through the task runner of the enclosing Prefect flow (see the module doc): each
    request is a task run (`expand-node`) of `trinity.pool.worker.expand_request`, submitted once its slots of
    the pool's limits are taken, and holding them until its reply is back in this process.

    `workers` maps each worker process id to what it reported on its last call (models loaded, whether it
    imported DuckDB): the evidence that models load once per process and that workers never open the store.
    """

    def __init__(self):
        self.workers: dict[int, dict[str, Any]] = {}
        self.submitted = 0
        self._task = None

    def _expand_task(self):
        if self._task is None:
            from prefect import task
            from prefect.cache_policies import NO_CACHE

            self._task = task(expand_request, name="expand-node", cache_policy=NO_CACHE, persist_result=False)
        return self._task

    async def _one(self, pool, r) -> ChatResponse:
        task = self._expand_task()
        loop = asyncio.get_running_loop()
        async with pool.limits.slot(r.idx):
            future = task.submit(pool.settings[r.idx].model_dump(), [[m.role, m.content] for m in r.messages],
                                 asdict(r.sampling))
            self.submitted += 1
            finished = loop.create_future()

            def done(_) -> None:  # on the runner's thread: wake this loop (the result is fetched below)
                loop.call_soon_threadsafe(lambda: finished.done() or finished.set_result(None))

            future.add_done_callback(done)
            await finished
            fields, info = await asyncio.to_thread(future.result)  # blocking fetch, off the event loop
        self.workers[info["pid"]] = info
        return ChatResponse(**fields)

    async def expand(self, pool, requests: Sequence) -> AsyncIterator[tuple[int, ChatResponse]]:
        if not in_prefect_flow():
            raise RuntimeError("a pool built with a TaskRunnerExecutor is called outside a Prefect flow: run the "
                               "code that calls it under `trinity.pool.task_runner.run_expanding`")

        async def one(j: int, r):
            return j, await self._one(pool, r)

        for fut in asyncio.as_completed([one(j, r) for j, r in enumerate(requests)]):
            yield await fut


def executor_for(ps: PoolSettings) -> TaskRunnerExecutor | None:
    """The executor a pool is built with for `pool.task_runner` (module doc): a TaskRunnerExecutor when the task
    runner is used (`use_task_runner`), else None (in process)."""
    return TaskRunnerExecutor() if use_task_runner(ps) else None


class _StaysHere(Generic[T]):
    """A value that stays in this process: pickled, it is empty. A flow run's context (flow included) is pickled to
    every Dask worker, and the training loop a flow runs holds the pool and the store (which must not, and cannot,
    travel); the workers never run the flow's body."""

    def __init__(self, value: T | None):
        self.value = value

    def __reduce__(self):
        return (_StaysHere, (None,))


def run_expanding(fn: Callable[[], T], settings: PoolSettings, pool, *, name: str = "trinity-expand") -> T:
    """`fn()`, in a Prefect flow owning the task runner of `settings` (the pool's) when `pool`'s executor is a
    TaskRunnerExecutor (its never-seen requests then run as task runs: module doc), else plainly."""
    if not isinstance(pool.executor, TaskRunnerExecutor):
        return fn()
    from prefect import flow

    runner = make_task_runner(settings)
    training = _StaysHere(fn)

    def body():
        return training.value()

    expand_flow = flow(body, name=name, task_runner=runner, persist_result=False,
                       validate_parameters=False, log_prints=False)  # progress prints reach the terminal
    try:
        with _api_url_in_settings(settings):
            return expand_flow()
    finally:
        training.value = None  # Prefect may keep the flow; the training loop (its pool, its store) goes
