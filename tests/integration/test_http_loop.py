"""Nothing slow on the loop that carries the pool's HTTP (`trinity.pool.http_loop`).

llama.cpp's server closes a connection whose request has not arrived within 5 s (cpp-httplib's keep-alive timeout).
When the pool's calls ran on the caller's loop, a caller that blocked it — the encoder's forward pass, grading in
the sandbox — for longer than that killed the connections its calls had opened or kept alive ("Cannot write to
closing transport"), and the retries hid it. These tests block the caller for 6 s with the pool's retries off,
against a real llama-server, and check that every call succeeds and that its seconds are the call's, not the stall.
"""
from __future__ import annotations

import asyncio
import threading
import time

import pytest

from trinity.config import PoolSettings
from trinity.pool import llama_server
from trinity.pool.http_loop import http_loop, on_http_loop, run_blocking, watch_slow_callbacks
from trinity.pool.llama_server import binary_problem
from trinity.pool.runtime import build_pool
from trinity.records import ChatMessage

SMOL = {"name": "smol", "backend": "local", "model": "smollm2-135m-instruct", "max_tokens": 8, "temperature": 0.0}
STALL_S = 6.0
"""Longer than cpp-httplib's 5 s keep-alive timeout: what an encode or a sandboxed grade can take on 2 cores."""


def ask(i: int) -> list[ChatMessage]:
    return [ChatMessage("user", f"Say the number {i}.")]


@pytest.fixture
def retries_off(monkeypatch):
    """The pool's connection retries off: a dropped connection is a failed call, not hidden by another attempt. The
    servers this test starts are stopped after it (later tests count the starts they cause)."""
    monkeypatch.setattr(llama_server, "CONNECTION_RETRIES", 0)
    yield
    llama_server.LLAMA_SERVERS.stop_all()


def test_the_http_loop_is_one_per_process_and_not_the_callers():
    loop = http_loop()
    assert http_loop() is loop and not on_http_loop()

    async def where():
        return on_http_loop(), asyncio.get_running_loop()

    assert run_blocking(where()) == (True, loop)
    assert asyncio.run(asyncio.sleep(0, "x")) == "x"  # a caller's own loop is untouched


def test_watch_slow_callbacks_catches_a_blocking_callback_on_the_http_loop():
    """The guard the evaluation test runs under must be able to fail."""
    with watch_slow_callbacks(0.2) as slow:
        http_loop().call_soon_threadsafe(time.sleep, 0.5)
        run_blocking(asyncio.sleep(0.05))
    assert slow and "took" in slow[0]
    with watch_slow_callbacks(0.2) as slow:
        run_blocking(asyncio.sleep(0.3))  # waiting is not blocking
    assert slow == []


@pytest.mark.skipif(binary_problem() is not None, reason=str(binary_problem()))
def test_calls_survive_a_caller_that_blocks_its_loop_longer_than_the_servers_keepalive(retries_off):
    """Concurrent calls against a real llama-server, retries off, while the caller blocks its own loop for 6 s: once
    the calls have started for a few of its loop's iterations (so some are opening their connections: at f611ab6,
    where the calls ran on the caller's loop, 4 of 4 failed with "Cannot write to closing transport" after 5 and after
    8 iterations on this machine), and once while the connections of earlier calls sit idle. Every call succeeds,
    none is counted as a failure, and no call's seconds include the stall."""
    pool = build_pool(PoolSettings.model_validate({"members": [SMOL], "max_concurrency": 8}), None)

    async def caller():
        await pool.complete(0, ask(0))  # the server is started (a start is not part of the test)
        replies = []
        for batch, iterations in enumerate((2, 4, 5, 6, 8, 10)):
            calls = [asyncio.create_task(pool.complete(0, ask(10 * batch + i))) for i in range(1, 5)]
            for _ in range(iterations):  # the calls get this far on their way...
                await asyncio.sleep(0)
            time.sleep(STALL_S)  # ...then an encoder (or the sandbox) holds this loop
            replies += await asyncio.gather(*calls)
        time.sleep(STALL_S)  # the connections of the calls above sit idle past the server's keep-alive timeout
        replies += await asyncio.gather(*(pool.complete(0, ask(100 + i)) for i in range(4)))
        return replies

    with watch_slow_callbacks(1.0) as slow:
        replies = asyncio.run(caller())
    assert [r.error for r in replies if not r.ok] == []
    assert pool.stats.failures == 0 and pool.stats.calls_made == 29
    assert max(r.latency_s for r in replies) < STALL_S - 1, [r.latency_s for r in replies]
    assert slow == [], slow


@pytest.mark.skipif(binary_problem() is not None, reason=str(binary_problem()))
def test_calls_from_several_blocking_threads_share_the_one_http_loop(retries_off):
    """Serving's shape: episodes on threads of their own, each blocking its loop in turn (an encode), all calling the
    one pool; every call succeeds with retries off."""
    pool = build_pool(PoolSettings.model_validate({"members": [SMOL], "max_concurrency": 4}), None)
    results: list = []

    def episode(i: int) -> None:
        async def play():
            task = asyncio.create_task(pool.complete(0, ask(100 + i)))
            await asyncio.sleep(0.05)
            time.sleep(STALL_S)
            results.append(await task)

        asyncio.run(play())

    threads = [threading.Thread(target=episode, args=(i,)) for i in range(3)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(results) == 3 and [r.error for r in results if not r.ok] == []
