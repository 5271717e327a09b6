"""One pool call away from the main process: the body of a Prefect task on a thread or a Dask worker.

Plain data in and out (member settings, messages, sampling → response fields), so it pickles to any
worker process. A local member is built once per process and its GGUF is loaded once per process
(`trinity.pool.local` keeps loaded models); an HTTP member gets a fresh client per call (an async client
belongs to one event loop). This module never imports the store: workers return responses and the main
process, the store's only writer, records them.
"""
from __future__ import annotations

import asyncio
import dataclasses
import os
import sys
import threading
from typing import Any

from trinity.config import PoolMember
from trinity.records import ChatMessage, ChatResponse, SamplingParams

_LOCAL_MEMBERS: dict[str, Any] = {}
_LOCK = threading.Lock()


def _local_member(member: PoolMember):
    from trinity.pool.local import LocalChatModel

    key = member.model_dump_json()
    with _LOCK:
        m = _LOCAL_MEMBERS.get(key)
        if m is None:
            m = _LOCAL_MEMBERS[key] = LocalChatModel(member)
        return m


async def _remote_call(member: PoolMember, messages: list[ChatMessage], sampling: SamplingParams) -> ChatResponse:
    from trinity.pool.openai_compat import OpenAICompatibleChatModel

    async with OpenAICompatibleChatModel(member) as model:
        return await model.chat(messages, sampling)


def worker_info() -> dict[str, Any]:
    """Who ran a call: process id, the models this process has loaded, and whether it imported DuckDB
    (it must not: one writer)."""
    from trinity.pool import local

    return {"pid": os.getpid(), "models_loaded": list(local.LOADS), "duckdb_imported": "duckdb" in sys.modules}


def expand_request(member: dict, messages: list[list[str]], sampling: dict) -> tuple[dict, dict]:
    """Run one request; returns (ChatResponse fields, worker_info()). Model-side failures come back as a
    failed response (ok=False), as from any ChatModel."""
    m = PoolMember.model_validate(member)
    msgs = [ChatMessage(role, content) for role, content in messages]
    sp = SamplingParams(**sampling)
    if m.backend == "local":
        resp = _local_member(m).generate(msgs, sp)
    else:
        resp = asyncio.run(_remote_call(m, msgs, sp))
    return dataclasses.asdict(resp), worker_info()
