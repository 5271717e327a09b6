"""The embedded pool on a real model (SmolLM2-135M GGUF through llama-cpp-python)."""
import asyncio
import time

import pytest

from trinity.config import PoolMember, PoolSettings
from trinity.coordinator.roles import Role, role_messages
from trinity.pool.bundled import BUNDLED, ModelAssemblyError, model_path, resolve_gguf
from trinity.pool.runtime import build_pool
from trinity.records import ChatMessage, Task
from trinity.store import Store

TASK = Task(id="t/1", source="gsm8k", prompt=("What is 7 times 6?",), grader="math", answer="42")
SMOL = PoolMember(name="smol", backend="local", model="smollm2-135m-instruct", max_tokens=24, temperature=0.7)


def test_bundled_models_are_pinned_and_verified():
    for mid in BUNDLED:
        p = model_path(mid)
        assert p.exists() and p.with_suffix(p.suffix + ".sha256").read_text().strip()
    with pytest.raises(ModelAssemblyError, match="neither a bundled model"):
        resolve_gguf("no-such-model")


def test_tampered_cache_is_reassembled(tmp_path, monkeypatch):
    monkeypatch.setenv("TRINITY_MODEL_CACHE", str(tmp_path))
    p = model_path("smollm2-135m-instruct")
    marker = p.with_suffix(p.suffix + ".sha256")
    marker.write_text("0" * 64 + "\n")  # a stale/tampered marker is not trusted
    assert model_path("smollm2-135m-instruct") == p
    assert marker.read_text().strip() == "b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53"


def test_calls_are_stored_and_never_repeated(tmp_path):
    msgs = role_messages(Role.WORKER, TASK, ())
    with Store(tmp_path / "s.duckdb") as store:
        pool = build_pool(PoolSettings(members=[SMOL]), store, {"verifier": 8})

        async def go():
            a, b = await asyncio.gather(pool.complete(0, msgs, "worker"), pool.complete(0, msgs, "worker"))
            return a, b
        a, b = asyncio.run(go())
        assert a.ok and a.text and a is b  # identical in-flight requests share one call
        assert pool.stats.calls_made == 1 and pool.stats.completion_tokens > 0
        v = asyncio.run(pool.complete(0, msgs, "verifier"))  # role cap changes sampling → a new key
        assert pool.stats.calls_made == 2 and v.completion_tokens <= 8
    with Store(tmp_path / "s.duckdb") as store:
        pool = build_pool(PoolSettings(members=[SMOL]), store, {"verifier": 8})
        again = asyncio.run(pool.complete(0, msgs, "worker"))
        asyncio.run(pool.complete(0, msgs, "verifier"))
        assert pool.stats.calls_made == 0 and pool.stats.store_hits == 2
        assert again.text == a.text


def test_local_call_does_not_block_event_loop(tmp_path):
    pool = build_pool(PoolSettings(members=[SMOL.model_copy(update={"max_tokens": 48})]), None)
    ticks = []

    async def heartbeat(stop):
        while not stop.is_set():
            ticks.append(time.perf_counter())
            await asyncio.sleep(0.02)

    async def go():
        stop = asyncio.Event()
        hb = asyncio.create_task(heartbeat(stop))
        r = await pool.complete(0, [ChatMessage("user", "Write a haiku about the sea.")], "worker")
        stop.set()
        await hb
        return r

    r = asyncio.run(go())
    assert r.ok
    assert len(ticks) >= 5  # the loop kept running while the model decoded in a worker thread


def test_base_model_gets_completion_prompt():
    gemma = PoolMember(name="gemma", backend="local", model="gemma-3-270m", max_tokens=24, temperature=0.0)
    pool = build_pool(PoolSettings(members=[gemma]), None)
    assert pool.members[0].completion_style
    r = asyncio.run(pool.complete(0, role_messages(Role.WORKER, TASK, ()), "worker"))
    assert r.ok and r.completion_tokens > 0
