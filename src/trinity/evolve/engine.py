"""Expansion on an engine: the never-seen nodes of a turn run as Prefect tasks.

A generation walks the memoised rollout trees; each turn, the requests that no stored response answers
(across the whole population, deduplicated) are *expanded*. Under Prefect, every such request is a task
run (`expand-node`) on the task runner named by `evolve.task_runner`:

- "threads": Prefect's ThreadPoolTaskRunner in this process (max_workers = pool.max_concurrency);
- "dask":    prefect-dask's DaskTaskRunner, on the existing cluster whose scheduler is `evolve.dask_address`
             (checked to answer, with at least one worker, before anything runs), else on a
             distributed.LocalCluster of `evolve.dask_workers` worker processes (`dask_threads_per_worker`
             threads each, on 127.0.0.1, no dashboard). Each worker loads the local models it is asked for once
             and keeps them. Workers report their task runs to this process's Prefect API: its URL (the
             ephemeral server's when PREFECT_API_URL is unset) is in the settings context Prefect ships with
             every task, and in a LocalCluster's environment; left alone, each worker would start an ephemeral
             server of its own. The workers of an existing cluster must run this checkout's code (same venv or
             install): a task names `trinity.pool.worker.expand_request`, which they import.

Workers receive plain data (member settings, messages, sampling) and return the response; the main process
prices, counts and stores it (`Pool._record`): DuckDB has one writer, and no worker opens the store.
Results do not depend on the runner: a stored sample is fixed by its request, whoever computed it.

`run_expanding(fn, settings, pool)` runs `fn()` (a training loop) inside a Prefect flow that owns the task
runner, with the pool's expansion switched to `TaskRunnerExpansion`. Whether Prefect is used at all:
always for "dask"; for "threads" only when already inside a Prefect flow (the pipeline's flows), so
`trinity stage ...` stays free of Prefect and runs the same calls on asyncio worker threads.
"""
from __future__ import annotations

import asyncio
import contextlib
import sys
import threading
import uuid
from dataclasses import asdict
from typing import Any, AsyncIterator, Callable, Sequence, TypeVar

from trinity.config import EvolveSettings, Settings
from trinity.pool.worker import expand_request
from trinity.records import ChatResponse

T = TypeVar("T")


def in_prefect_flow() -> bool:
    if "prefect" not in sys.modules:  # not imported → certainly not inside a flow run
        return False
    from prefect.context import FlowRunContext

    return FlowRunContext.get() is not None


def use_task_runner(ev: EvolveSettings) -> bool:
    return ev.task_runner == "dask" or in_prefect_flow()


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
    """evolve.dask_address names no usable cluster: bad input, not an outage to retry (a ValueError, as
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

    key = "evolve.dask_address"
    deadline = None
    while True:
        try:
            info = asyncio.run(_scheduler_identity(address, timeout))
        except (OSError, asyncio.TimeoutError, TimeoutError) as e:
            raise DaskClusterError(
                f"{key}: no Dask scheduler answers at {address} (waited {timeout:g} s: {type(e).__name__}: {e}). "
                f"Start one (`dask scheduler`, README \"Dask: evolve on an existing cluster\") or clear {key} "
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


def make_task_runner(ev: EvolveSettings, max_threads: int):
    if ev.task_runner == "threads":
        from prefect.task_runners import ThreadPoolTaskRunner

        return ThreadPoolTaskRunner(max_workers=max(1, max_threads))
    if ev.task_runner == "dask":
        from prefect_dask import DaskTaskRunner

        if ev.dask_address:
            check_scheduler(ev.dask_address)
            return DaskTaskRunner(address=ev.dask_address)
        return DaskTaskRunner(cluster_class="distributed.LocalCluster", cluster_kwargs={
            "n_workers": ev.dask_workers, "threads_per_worker": ev.dask_threads_per_worker, "processes": True,
            "host": "127.0.0.1", "dashboard_address": None, "env": {"PREFECT_API_URL": prefect_api_url()}})
    raise ValueError(f"unknown evolve.task_runner {ev.task_runner!r}")


@contextlib.contextmanager
def _api_url_in_settings(ev: EvolveSettings):
    """For Dask: this process's Prefect API URL in its settings, which Prefect ships to the workers with every
    task (without it, a worker of an existing cluster would start an ephemeral API server of its own)."""
    from prefect.settings import PREFECT_API_URL, temporary_settings

    if ev.task_runner != "dask" or PREFECT_API_URL.value():
        yield
        return
    with temporary_settings(updates={PREFECT_API_URL: prefect_api_url()}):
        yield


_expand_task = None


def _task():
    global _expand_task
    if _expand_task is None:
        from prefect import task
        from prefect.cache_policies import NO_CACHE

        _expand_task = task(expand_request, name="expand-node", cache_policy=NO_CACHE, persist_result=False)
    return _expand_task


class TaskRunnerExpansion:
    """Expansion through the task runner of the enclosing Prefect flow (see the module doc).

    `workers` maps each worker process id to what it reported on its last call (models loaded, whether it
    imported DuckDB): the evidence that models load once per process and that workers never open the store.
    """

    def __init__(self):
        self.workers: dict[int, dict[str, Any]] = {}
        self.submitted = 0

    async def expand(self, pool, requests: Sequence) -> AsyncIterator[tuple[int, ChatResponse]]:
        from prefect.futures import as_completed

        task = _task()
        futures = [task.submit(pool.settings[r.idx].model_dump(), [[m.role, m.content] for m in r.messages],
                               asdict(pool.sampling(r.idx, r.role))) for r in requests]
        self.submitted += len(futures)
        index = {f.task_run_id: j for j, f in enumerate(futures)}
        loop = asyncio.get_running_loop()
        queue: asyncio.Queue = asyncio.Queue()

        def wait() -> None:  # blocking waits off the event loop; results handed back in completion order
            try:
                for f in as_completed(futures):
                    loop.call_soon_threadsafe(queue.put_nowait, (index[f.task_run_id], f.result(), None))
            except BaseException as e:  # noqa: BLE001 - re-raised in the event loop
                loop.call_soon_threadsafe(queue.put_nowait, (None, None, e))

        threading.Thread(target=wait, name="expand-wait", daemon=True).start()
        for _ in range(len(futures)):
            j, result, err = await queue.get()
            if err is not None:
                raise err
            fields, info = result
            self.workers[info["pid"]] = info
            yield j, ChatResponse(**fields)


_CALLS: dict[str, Callable[[], Any]] = {}
"""Training loops waiting to run inside their flow, by call id. The flow function takes only the id: a flow
run's context (flow included) is pickled to every Dask worker, so the flow must not close over the store."""


def _run_registered(call_id: str):
    return _CALLS[call_id]()


def run_expanding(fn: Callable[[], T], settings: Settings, pool, *, task_runner: bool | None = None,
                  expansion: TaskRunnerExpansion | None = None, name: str = "trinity-expand") -> T:
    """`fn()` with the pool's never-seen nodes expanded on `evolve.task_runner` (see module doc).
    task_runner: force Prefect on (True) or off (False); None = `use_task_runner(settings.evolve)`.
    expansion: pass one to inspect it afterwards (which workers ran what)."""
    if task_runner is None:
        task_runner = use_task_runner(settings.evolve)
    if not task_runner:
        return fn()
    from prefect import flow

    runner = make_task_runner(settings.evolve, settings.pool.max_concurrency)
    expansion = expansion if expansion is not None else TaskRunnerExpansion()
    expand_flow = flow(_run_registered, name=name, task_runner=runner, persist_result=False,
                       validate_parameters=False, log_prints=False)  # progress prints reach the terminal
    call_id = uuid.uuid4().hex
    previous = pool.expansion
    _CALLS[call_id] = fn
    pool.expansion = expansion
    try:
        with _api_url_in_settings(settings.evolve):
            return expand_flow(call_id)
    finally:
        pool.expansion = previous
        _CALLS.pop(call_id, None)
