"""One pool call away from the main process: the body of a Prefect task on a thread or a Dask worker.

Plain data in and out (member settings, messages, sampling → response fields), so it pickles to any
worker process. Each process builds a member once, on its first request, and keeps it (`PROCESS_MEMBERS`): a
local member's GGUF is loaded once per process (`trinity.pool.local.LLAMA_MODELS`), and an HTTP member keeps its
client (its connections) and its `max_concurrency` across calls. This module never imports the store: workers
return responses and the main process, the store's only writer, records them. The pool-wide limits are the main
process's (`ConcurrencyLimits`: it holds a request's slots until the reply is back).
"""
from __future__ import annotations

import dataclasses
import os
import sys
import threading
from typing import Any

from trinity.config import PoolMember
from trinity.pool.members import build_member, over_http
from trinity.pool.http_loop import run_blocking
from trinity.records import ChatMessage, ChatResponse, SamplingParams


class ProcessMembers:
    """The pool members this process has built to run requests for a pool whose owner is another process (a
    Dask worker's) or another loop (Prefect's thread runner in the main process): one per member setting, built
    on its first request and kept for the life of the process.

    A local member run in process calls on the calling task's thread (`LocalChatModel.generate`). A member called
    over HTTP (an OpenAI-compatible endpoint, a local model's llama-server: started by this process) runs on
    the process's HTTP loop (`trinity.pool.http_loop`, on a daemon thread of its own): an async client belongs to
    one loop, so one loop lets every task thread share the member's client and its per-member limit (a task thread waits for its
    call's result)."""

    def __init__(self) -> None:
        self._members: dict[str, Any] = {}
        self._lock = threading.Lock()

    def member(self, settings: PoolMember):
        """The member of `settings` in this process (built now if it is not yet)."""
        key = settings.model_dump_json()
        with self._lock:
            m = self._members.get(key)
            if m is None:
                m = build_member(settings)
                self._members[key] = m
            return m

    def run(self, settings: PoolMember, messages: list[ChatMessage], sampling: SamplingParams) -> ChatResponse:
        """One call of the member of `settings` (blocking); model-side failures come back as a failed response."""
        m = self.member(settings)
        if not over_http(settings):
            return m.generate(messages, sampling)
        return run_blocking(m.chat(messages, sampling))


PROCESS_MEMBERS = ProcessMembers()
"""The members this process runs requests with for a task runner (see ProcessMembers)."""


def worker_info() -> dict[str, Any]:
    """Who ran a call: process id, the models this process has loaded, the llama-servers it has started, and
    whether it imported DuckDB (it must not: one writer)."""
    from trinity.pool.local import LLAMA_MODELS

    servers = sys.modules.get("trinity.pool.llama_server")
    return {"pid": os.getpid(), "models_loaded": list(LLAMA_MODELS.loads),
            "servers_started": list(servers.LLAMA_SERVERS.starts) if servers is not None else [],
            "duckdb_imported": "duckdb" in sys.modules}


def expand_request(member: dict, messages: list[list[str]], sampling: dict) -> tuple[dict, dict]:
    """Run one request; returns (ChatResponse fields, worker_info()). Model-side failures come back as a
    failed response (ok=False), as from any ChatModel."""
    m = PoolMember.model_validate(member)
    msgs = [ChatMessage(role, content) for role, content in messages]
    resp = PROCESS_MEMBERS.run(m, msgs, SamplingParams(**sampling))
    return dataclasses.asdict(resp), worker_info()
