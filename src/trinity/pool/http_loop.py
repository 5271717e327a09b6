"""The loop that carries the pool's HTTP: one event loop per process, on a thread of its own, where nothing slow runs.

Every pool call goes through it (`Pool.complete_many` hands its work here from whatever loop or thread asks), so the
callers' slow work — the encoder's forward passes (torch, synchronous), grading (the sandbox runs a program for up
to minutes), an evolution step — never stalls a connection. Why it matters: llama.cpp's server (cpp-httplib) closes a
connection whose first request has not arrived within 5 s (its keep-alive timeout), so a loop that opens a connection
and then stalls for longer than that writes its request to a closed transport ("Cannot write to closing transport").
With HTTP on a loop of its own, a caller may block its own loop for as long as it likes: the calls it started go on.
The same stalls used to inflate the call seconds that the compute tables and the cost-aware reward read; measured on
this loop, a call's seconds are the request's time on the wire (`trinity.pool.openai_client`).

What runs on this loop is the pool's own bookkeeping: the store lookup (a dict), the in-flight sharing, the HTTP
clients, and the store write of each reply (one small DuckDB transaction). Local models run in process go to worker
threads from here (`asyncio.to_thread`), as they did before. Evolve, evaluate, serve, the task-runner workers and the
benches all use this one loop.

`watch_slow_callbacks` turns on asyncio's debug check on this loop: every callback that holds it longer than a
threshold is logged (logger "asyncio", "Executing <...> took N seconds"); the tests fail on any over 1 s.
"""
from __future__ import annotations

import asyncio
import atexit
import concurrent.futures
import contextlib
import logging
import os
import threading
from typing import Coroutine, Iterator, TypeVar

T = TypeVar("T")

THREAD_NAME = "trinity-pool-http"

_lock = threading.Lock()
_loop: asyncio.AbstractEventLoop | None = None
_thread: threading.Thread | None = None


def http_loop() -> asyncio.AbstractEventLoop:
    """This process's HTTP loop, started on first use (a daemon thread: it never keeps a process alive)."""
    global _loop, _thread
    with _lock:
        if _loop is None or _loop.is_closed() or _thread is None or not _thread.is_alive():
            loop = asyncio.new_event_loop()
            ready = threading.Event()

            def run() -> None:
                asyncio.set_event_loop(loop)
                loop.call_soon(ready.set)
                loop.run_forever()

            _thread = threading.Thread(target=run, name=THREAD_NAME, daemon=True)
            _thread.start()
            ready.wait()
            _loop = loop
        return _loop


def on_http_loop() -> bool:
    """Whether the caller runs on the HTTP loop itself."""
    try:
        return asyncio.get_running_loop() is _loop
    except RuntimeError:
        return False


async def run_on_http_loop(coro: Coroutine[object, object, T]) -> T:
    """Await `coro` run on the HTTP loop (directly when already there). The caller's context variables go with it
    (`run_coroutine_threadsafe` schedules it in a copy of the caller's context); cancelling the caller cancels it."""
    if on_http_loop():
        return await coro
    return await asyncio.wrap_future(asyncio.run_coroutine_threadsafe(coro, http_loop()))


def run_blocking(coro: Coroutine[object, object, T], timeout: float | None = None) -> T:
    """`coro` on the HTTP loop, from synchronous code on any other thread (a task runner's worker thread)."""
    if on_http_loop():
        raise RuntimeError("run_blocking called on the HTTP loop itself: await the coroutine instead")
    return asyncio.run_coroutine_threadsafe(coro, http_loop()).result(timeout)


def call_soon(fn, *args) -> concurrent.futures.Future:
    """`fn(*args)` run on the HTTP loop (a plain function, e.g. to read its state from its own thread)."""
    fut: concurrent.futures.Future = concurrent.futures.Future()

    def run() -> None:
        try:
            fut.set_result(fn(*args))
        except BaseException as e:  # noqa: BLE001 - handed to the caller
            fut.set_exception(e)

    http_loop().call_soon_threadsafe(run)
    return fut


@contextlib.contextmanager
def watch_slow_callbacks(threshold_s: float = 1.0) -> Iterator[list[str]]:
    """Within the block, every callback that holds the HTTP loop longer than `threshold_s` is recorded (asyncio's
    debug mode, `slow_callback_duration`): the list yielded gets asyncio's message for each. The tests use it to
    check that nothing slow runs where the HTTP does."""
    loop = http_loop()
    seen: list[str] = []

    class _Catch(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            msg = record.getMessage()
            if msg.startswith("Executing") and " took " in msg:
                seen.append(msg)

    handler = _Catch(logging.WARNING)
    log = logging.getLogger("asyncio")
    log.addHandler(handler)
    before = log.level
    if log.level == logging.NOTSET or log.level > logging.WARNING:
        log.setLevel(logging.WARNING)

    def debug(on: bool) -> None:
        loop.slow_callback_duration = threshold_s if on else 0.1
        loop.set_debug(on)

    call_soon(debug, True).result(10)
    try:
        yield seen
    finally:
        call_soon(debug, False).result(10)
        log.removeHandler(handler)
        log.setLevel(before)


def _shutdown() -> None:
    """At exit: finalise the loop's async generators (they close the members' HTTP clients), then stop it."""
    loop = _loop
    if loop is None or loop.is_closed() or _thread is None or not _thread.is_alive():
        return
    try:
        asyncio.run_coroutine_threadsafe(loop.shutdown_asyncgens(), loop).result(5)
    except Exception:  # noqa: BLE001 - best effort at exit
        pass
    loop.call_soon_threadsafe(loop.stop)


def _after_fork_in_child() -> None:
    """A forked child has no thread running the parent's loop: it starts its own on first use."""
    global _loop, _thread
    _loop, _thread = None, None


atexit.register(_shutdown)
os.register_at_fork(after_in_child=_after_fork_in_child)

