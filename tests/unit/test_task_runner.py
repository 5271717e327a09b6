"""The pool's task-runner executor: chosen from the pool's settings, and refused outside a Prefect flow."""
import asyncio

import pytest

from trinity.config import PoolSettings
from trinity.pool.task_runner import TaskRunnerExecutor, executor_for

POOL = {"members": [{"name": "a", "backend": "local", "model": "smollm2-135m-instruct"}]}


def test_the_pool_settings_choose_the_executor_outside_prefect():
    assert executor_for(PoolSettings.model_validate(POOL)) is None  # threads, no flow: in process
    assert isinstance(executor_for(PoolSettings.model_validate({**POOL, "task_runner": "dask"})), TaskRunnerExecutor)


def test_a_task_runner_executor_called_outside_a_flow_says_how_to_run_it():
    async def expand():
        return [x async for x in TaskRunnerExecutor().expand(None, [object()])]

    with pytest.raises(RuntimeError, match="outside a Prefect flow.*run_expanding"):
        asyncio.run(expand())
