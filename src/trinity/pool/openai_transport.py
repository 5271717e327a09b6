"""The HTTP plumbing of `trinity.pool.openai_client.EndpointClient`: the SDK's transport (aiohttp or httpx, idle
connections dropped after IDLE_CONNECTION_EXPIRY_S), closing a client with the event loop it belongs to, the holder
that keeps an API key out of every repr, and an endpoint's URL without credentials or query.
"""
from __future__ import annotations

import asyncio
import contextlib
import importlib.util
from typing import Any, AsyncIterator
from urllib.parse import urlsplit, urlunsplit

import httpx2
import openai

from trinity.pool.errors import PoolConfigError


IDLE_CONNECTION_EXPIRY_S = 2.0
"""How long the client keeps an idle connection for reuse: below the shortest idle limit of the servers we call
(llama.cpp's server, cpp-httplib, closes a kept-alive connection after 5 s; the SDK's default, 5 s, races it), so a
call never reuses a connection the server is closing. Against a remote API a lapsed connection costs one reconnect."""


def _http_client(transport: str, timeout_s: float, member_name: str) -> Any:
    """The SDK's aiohttp-backed client when asked for (or "auto" and aiohttp is installed), else the SDK's httpx
    client; either drops idle connections after IDLE_CONNECTION_EXPIRY_S."""
    if transport not in ("auto", "aiohttp", "httpx"):
        raise PoolConfigError(f"pool member {member_name!r}: unknown transport {transport!r}")
    limits = httpx2.Limits(max_connections=1000, max_keepalive_connections=100,
                           keepalive_expiry=IDLE_CONNECTION_EXPIRY_S)
    if transport == "httpx" or importlib.util.find_spec("aiohttp") is None:
        if transport == "aiohttp":
            raise PoolConfigError(f"pool member {member_name!r}: transport 'aiohttp' needs the aiohttp package")
        return openai.DefaultAsyncHttpxClient(timeout=timeout_s, limits=limits)
    return openai.DefaultAioHttpClient(timeout=timeout_s, limits=limits)


def _close_on(loop: asyncio.AbstractEventLoop, client: Any) -> None:
    """Close `client` on `loop` (from any thread), unless the loop is gone (its shutdown closed the client)."""
    async def close() -> None:
        with contextlib.suppress(Exception):
            await client.close()

    with contextlib.suppress(RuntimeError):  # the loop is closed
        if not loop.is_closed():
            asyncio.run_coroutine_threadsafe(close(), loop)


async def _close_at_loop_end(client: Any) -> AsyncIterator[None]:
    """An async generator whose only job is its `finally`: once started on a loop, the loop's shutdown
    (`asyncio.run` calls `loop.shutdown_asyncgens()` before closing it; PEP 525) finalises it, closing `client`."""
    try:
        yield
    finally:
        with contextlib.suppress(Exception):
            await client.close()


class _Secret:
    """Holds a key so that printing the holder (repr, vars(), a debugger) never shows it."""

    __slots__ = ("_value",)

    def __init__(self, value: str | None) -> None:
        self._value = value

    def values(self) -> tuple[str, ...]:
        return (self._value,) if self._value else ()

    def __repr__(self) -> str:
        return "_Secret('***')" if self._value else "_Secret(None)"

    __str__ = __repr__

    def __reduce__(self) -> Any:
        raise TypeError("a secret is not picklable")



def _public_url(url: str) -> str:
    """The URL without credentials or query (both may carry keys)."""
    parts = urlsplit(url)
    host = parts.hostname or ""
    if parts.port:
        host = f"{host}:{parts.port}"
    return urlunsplit((parts.scheme, host, parts.path.rstrip("/"), "", ""))
