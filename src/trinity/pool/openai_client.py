"""The client of one OpenAI-compatible endpoint: the one call path of every pool member that calls over HTTP.

Both HTTP members hold one (`EndpointClient`): the OpenAI-compatible member (`trinity.pool.openai_compat`), which
builds the request body of a chat completion, and the llama-server member (`trinity.pool.llama_server`), which builds
what llama-cpp-python would be asked in process and holds a client per running server. The member says what to ask
(a route and a JSON body); the client sends it and turns whatever comes back into a ChatResponse.

Built on the official `openai` SDK (its client: auth, base URL, error mapping, transport) with the
SDK's own retries switched off (max_retries=0): retries are ours, because we want one policy across
providers and exact accounting of every attempt. `latency_s` of a ChatResponse is the whole call,
retries and backoff included; `model` is the member's `model_id`.

Per call:
  * concurrency: the member's slot (`member_limit`), then the pool-wide one (`global_limit`, from
    `pool.max_concurrency`); a pool passes both from its `ConcurrencyLimits` (`trinity.pool.base`), which its
    task-runner executor uses too. Slots are held only while a request is on the wire, never while backing off,
    so one throttled model does not starve the others.
  * deadline: `timeout_s` per attempt, enforced both by the HTTP client and by an asyncio
    timeout around the whole attempt (a server that trickles bytes cannot outlive it).
  * retries: up to `max_retries` more attempts for 408/409/429/5xx, timeouts (unless `retry_timeouts` is off:
    a local server is slow only because its CPU is busy, and asking again would only add to its queue),
    dropped connections and unparseable (truncated) bodies. Delay = full jitter, uniform(0, min(cap,
    base·2^attempt)), but never less than the server's Retry-After (`retry-after-ms`, or
    `Retry-After` in seconds or as an HTTP date). A Retry-After beyond `max_retry_after_s`, or a 429
    saying the quota is exhausted, ends the call at once: waiting would not help.
  * a reply that parses but carries no answer (no choices, null or empty content) is a failed
    ChatResponse with the reason, not retried: the endpoint answered, and it was billed.
  * never raises for model-side failures: the result is a ChatResponse with ok=False and the reason.
  * a failure's kind (`ChatResponse.failure`): "deterministic" when the request itself is refused (HTTP
    400/413/422: invalid, too long, filtered) or answered without content — the pool stores it as the
    answer; "transient" for everything else (throttling, 5xx, timeouts, dropped connections, truncated
    bodies, exhausted quota, auth) — an outage is not a sample: counted, logged, asked again next run.
  * cost: the reply's token usage at the member's prices (`prices`, $ per million input and output tokens).

Secrets: the API key lives only in the SDK client and in a holder whose repr is masked
(`openai_transport._Secret`, used to scrub error texts); every error text that leaves this module goes through
`trinity.redact` with the key as an explicit secret (a proxy that echoes the Authorization header in an error body
is scrubbed too).
"""
from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import json
import logging
import random
import time
import weakref
from dataclasses import dataclass
from typing import Any, Awaitable, Callable, Literal

import httpx2
import openai

from trinity.pool.base import LoopLocalSemaphore
from trinity.pool.openai_transport import _close_at_loop_end, _close_on, _http_client, _Secret
from trinity.pool.openai_wire import (_cause_chain, _error_code, _error_message, _excerpt, _is_real_timeout, _usage,
                                      parse_retry_after)
from trinity.records import ChatResponse
from trinity.redact import redact_text

log = logging.getLogger(__name__)

_RETRYABLE_STATUS = frozenset({408, 409, 429})
_DETERMINISTIC_STATUS = frozenset({400, 413, 422})
"""Refusals of the request itself (invalid, too long, content filter): stored as the answer, not retried."""
_NO_KEY_PLACEHOLDER = "no-key"  # the SDK insists on some key; keyless local servers ignore it


@dataclass(frozen=True)
class UsageTotals:
    """Accumulated over every call of one client since construction (or `reset_totals`)."""

    calls: int = 0
    ok_calls: int = 0
    failed_calls: int = 0
    attempts: int = 0
    """HTTP requests sent (calls + retries)."""
    retries: int = 0
    prompt_tokens: int = 0
    completion_tokens: int = 0
    cost_usd: float = 0.0


@dataclass(frozen=True)
class _Attempt:
    """The outcome of one HTTP attempt."""

    response: ChatResponse | None = None
    """Final answer (ok, or a failure that retrying would not fix)."""
    error: str | None = None
    """Set when the attempt failed in a retryable way."""
    retry_after_s: float | None = None
    give_up: bool = False
    timed_out: bool = False
    """The call ran past its deadline (not a connection the transport mapped to a timeout)."""
    deterministic: bool = False
    """The request itself is refused (invalid, too long, filtered): the same request fails the same way, so
    the failure is a sample (stored). Everything else that fails is an outage (retried on the next run)."""
    queued_s: float = 0.0
    """Seconds this attempt waited for a free slot of the pool's own limits before it was sent: the pool's queue,
    not the endpoint's time, so it is left out of the call's `latency_s`."""


class EndpointClient:
    """The HTTP client of one endpoint (`base_url`), on behalf of the member `name` whose replies it returns as
    `model_id`'s. See the module docstring for the policy.

    `backoff_base_s`, `backoff_max_s`, `max_retry_after_s` tune the retry delays; `rng` and `sleep`
    exist so tests can make backoff deterministic or fast. `transport`: "aiohttp" is the SDK's
    `DefaultAioHttpClient` (about half the client CPU per request of the default httpx transport, which
    matters at high concurrency on few cores); "httpx" the SDK default; "auto" = aiohttp when installed.
    Use the client inside one event loop at a time and `await aclose()` when done.
    """

    def __init__(
        self,
        *,
        name: str,
        model_id: str,
        base_url: str,
        api_key: str | None,
        timeout_s: float,
        max_retries: int,
        member_limit: LoopLocalSemaphore,
        global_limit: asyncio.Semaphore | LoopLocalSemaphore | None = None,
        prices: tuple[float, float] = (0.0, 0.0),
        retry_timeouts: bool = True,
        backoff_base_s: float = 0.5,
        backoff_max_s: float = 30.0,
        max_retry_after_s: float = 120.0,
        transport: Literal["auto", "aiohttp", "httpx"] = "auto",
        rng: random.Random | None = None,
        sleep: Callable[[float], Awaitable[Any]] = asyncio.sleep,
    ) -> None:
        self.name = name
        self.model_id = model_id
        self.base_url = base_url
        self.timeout_s = timeout_s
        self.max_retries = max_retries
        self._key = _Secret(api_key)  # kept only to scrub error texts; masked in any repr
        self._local_limit = member_limit
        self._global_limit = global_limit
        self._prices = prices
        self._retry_timeouts = retry_timeouts
        self._backoff_base_s = backoff_base_s
        self._backoff_max_s = backoff_max_s
        self._max_retry_after_s = max_retry_after_s
        self._rng = rng or random.Random()
        self._sleep = sleep
        self._totals = UsageTotals()
        self._transport = transport
        self._loop: asyncio.AbstractEventLoop | None = None
        self._closer: Any = None
        self._sdk = self._new_sdk_client()

    def _new_sdk_client(self) -> Any:
        return openai.AsyncOpenAI(
            api_key=(self._key.values() or (_NO_KEY_PLACEHOLDER,))[0],
            base_url=self.base_url,
            timeout=self.timeout_s,
            max_retries=0,
            http_client=_http_client(self._transport, self.timeout_s, self.name),
        )

    async def _bind_to_running_loop(self) -> None:
        """HTTP clients belong to one event loop; training runs one loop per generation (asyncio.run), so a
        new loop gets a new SDK client (the limits are LoopLocalSemaphores: they rebind themselves). The SDK client is
        closed when its loop shuts down (`_close_at_loop_end`), while the loop can still run the close: left to the
        garbage collector, a client of a finished loop tries to close itself on the next loop and fails ("Event
        loop is closed", "Unclosed client session")."""
        loop = asyncio.get_running_loop()
        if loop is self._loop:
            return
        if self._loop is not None:
            self._sdk = self._new_sdk_client()
        self._loop = loop
        self._closer = _close_at_loop_end(self._sdk)
        await self._closer.__anext__()
        # A loop that outlives this client (the pool's HTTP loop lives as long as the process): when the client is
        # collected, its SDK client is closed there, not left to the garbage collector ("Unclosed client session").
        weakref.finalize(self, _close_on, loop, self._sdk)

    # -- public ----------------------------------------------------------------------------------
    @property
    def totals(self) -> UsageTotals:
        return self._totals

    def reset_totals(self) -> None:
        self._totals = UsageTotals()

    def cost_of(self, prompt_tokens: int, completion_tokens: int) -> float:
        price_input, price_output = self._prices
        return (prompt_tokens * price_input + completion_tokens * price_output) / 1e6

    async def aclose(self) -> None:
        """Close the SDK client, on the loop it belongs to (a pool's members live on the pool's HTTP loop)."""
        loop = self._loop
        if loop is not None and loop is not asyncio.get_running_loop() and not loop.is_closed():
            await asyncio.wrap_future(asyncio.run_coroutine_threadsafe(self._sdk.close(), loop))
        else:
            await self._sdk.close()

    async def call(self, route: str, body: dict[str, Any]) -> ChatResponse:
        """POST `body` to `route` (relative to base_url), retried per the module policy. Never raises for
        model-side failures."""
        await self._bind_to_running_loop()
        t0 = time.monotonic()
        attempts = 0
        last_error = "no attempt made"
        deterministic = False
        queued_s = 0.0
        result: ChatResponse | None = None
        for attempt in range(self.max_retries + 1):
            attempts += 1
            outcome = await self._attempt(route, body)
            queued_s += outcome.queued_s
            if outcome.response is not None:
                result = outcome.response
                break
            last_error = outcome.error or "unknown failure"
            deterministic = outcome.deterministic
            if outcome.give_up or (outcome.timed_out and not self._retry_timeouts) or attempt == self.max_retries:
                break
            delay = self._backoff(attempt, outcome.retry_after_s)
            log.info("pool member %s: attempt %d failed (%s); retrying in %.2fs",
                     self.name, attempt + 1, last_error, delay)
            await self._sleep(delay)

        if result is None:
            reason = last_error if attempts == 1 else f"gave up after {attempts} attempts; last: {last_error}"
            result = ChatResponse(text="", ok=False, error=reason, model=self.model_id,
                                  failure="deterministic" if deterministic else "transient")
            log.warning("pool member %s: call failed: %s", self.name, reason)
        # The call's seconds: from the first attempt to the reply, retries and their backoff included, the waits for a
        # free slot of the pool's own limits left out (with many calls queued those can be hours, not model time).
        result = dataclasses.replace(result, latency_s=max(0.0, time.monotonic() - t0 - queued_s))
        self._account(result, attempts)
        return result

    # -- internals -------------------------------------------------------------------------------
    async def _attempt(self, route: str, body: dict[str, Any]) -> _Attempt:
        """One attempt, sent once a slot of the member's and the pool's limits is free (the wait is `queued_s`)."""
        global_limit = self._global_limit.get() if isinstance(self._global_limit, LoopLocalSemaphore) \
            else self._global_limit
        waited_from = time.monotonic()
        async with self._local_limit.get(), (global_limit or contextlib.nullcontext()):
            queued_s = time.monotonic() - waited_from
            outcome = await self._send(route, body)
        return dataclasses.replace(outcome, queued_s=queued_s)

    async def _send(self, route: str, body: dict[str, Any]) -> _Attempt:
        timeout_s = self.timeout_s
        try:
            async with asyncio.timeout(timeout_s):
                # The SDK's generic `post` (its documented way to call any route) rather than the typed
                # `chat.completions.create`: we build and parse the body ourselves (compatible servers
                # differ in what they accept and return), and it skips the SDK's per-call transform
                # of typed params (~1 ms of CPU per request, which caps throughput at high concurrency).
                raw = await self._sdk.post(route, cast_to=httpx2.Response, body=body,
                                           options={"timeout": timeout_s})
                text = raw.text
        except TimeoutError:
            return _Attempt(error=f"timeout after {timeout_s:g}s", timed_out=True)
        except openai.APITimeoutError as e:
            if _is_real_timeout(e):
                return _Attempt(error=f"timeout after {timeout_s:g}s", timed_out=True)
            # The aiohttp transport maps a dropped connection to a connect *timeout*; say what happened.
            return _Attempt(error=self._clean(f"connection error: {_cause_chain(e)}"))
        except openai.APIStatusError as e:
            return self._status_failure(e)
        except openai.APIConnectionError as e:
            return _Attempt(error=self._clean(f"connection error: {_cause_chain(e)}"))
        except openai.OpenAIError as e:
            return _Attempt(error=self._clean(f"client error: {type(e).__name__}: {e}"), give_up=True)
        except Exception as e:  # noqa: BLE001 - the contract: a model-side failure never raises
            # Anything else on the request path (a transport quirk, an SDK surprise) is recorded, not
            # raised: a training run must survive one odd endpoint. Cancellation still propagates.
            return _Attempt(error=self._clean(f"unexpected {type(e).__name__}: {e}"), give_up=True)
        return self._parse(text)

    def _status_failure(self, e: openai.APIStatusError) -> _Attempt:
        status = e.status_code
        detail = self._clean(_error_message(e))
        error = f"http {status}: {detail}" if detail else f"http {status}"
        headers = e.response.headers if e.response is not None else {}
        retry_after = parse_retry_after(headers)
        if status == 429 and _error_code(e) == "insufficient_quota":
            return _Attempt(error=error, give_up=True)
        if not (status in _RETRYABLE_STATUS or status >= 500):
            # 400/413/422: the request is invalid or too long (or filtered) — asking again gives the same.
            # 401/403/404 and the rest: the endpoint or its configuration, not the question — an outage.
            return _Attempt(error=error, give_up=True, deterministic=status in _DETERMINISTIC_STATUS)
        if retry_after is not None and retry_after > self._max_retry_after_s:
            return _Attempt(error=f"{error} (Retry-After {retry_after:.0f}s exceeds the "
                                  f"{self._max_retry_after_s:.0f}s we wait)", give_up=True)
        return _Attempt(error=error, retry_after_s=retry_after)

    def _parse(self, text: str) -> _Attempt:
        try:
            data = json.loads(text)
        except json.JSONDecodeError as e:
            if not text.strip():
                return _Attempt(error="malformed reply: empty body")
            truncated = e.pos >= len(text.rstrip()) or e.msg.startswith("Unterminated")
            kind = "truncated JSON" if truncated else "invalid JSON"
            return _Attempt(error=f"malformed reply: {kind} ({e.msg}; char {e.pos} of {len(text)})")
        if not isinstance(data, dict):
            return _Attempt(error=f"malformed reply: top level is {type(data).__name__}, not an object")
        if "error" in data and data.get("error") and not data.get("choices"):
            # Some compatible servers answer 200 with an error object.
            return _Attempt(error=self._clean(f"error in reply: {_excerpt(data['error'])}"))
        pt, ct = _usage(data.get("usage"))
        cost = self.cost_of(pt, ct)

        def failed(reason: str) -> _Attempt:
            # the endpoint answered (and billed) without content: refusal, content filter, blank — a sample
            return _Attempt(response=ChatResponse(text="", ok=False, error=reason, failure="deterministic", prompt_tokens=pt,
                                                  completion_tokens=ct, cost_usd=cost, model=self.model_id))

        choices = data.get("choices")
        if not isinstance(choices, list) or not choices:
            return failed("empty reply: no choices")
        choice = choices[0] if isinstance(choices[0], dict) else {}
        message = choice.get("message") if isinstance(choice.get("message"), dict) else {}
        # a chat completion's message content, or a (text) completion's text
        content = message.get("content") if "message" in choice or "text" not in choice else choice.get("text")
        finish = choice.get("finish_reason")
        if isinstance(content, list):  # content parts, as some servers send
            content = "".join(p.get("text", "") for p in content if isinstance(p, dict))
        if content is None:
            refusal = message.get("refusal")
            why = f"refusal: {_excerpt(refusal)}" if refusal else f"finish_reason={finish!r}"
            return failed(self._clean(f"empty reply: null content ({why})"))
        if not isinstance(content, str):
            return failed(f"malformed reply: content is {type(content).__name__}")
        if not content.strip():
            return failed(f"empty reply: blank content (finish_reason={finish!r})")
        return _Attempt(response=ChatResponse(text=content, ok=True, prompt_tokens=pt, completion_tokens=ct,
                                              cost_usd=cost, model=self.model_id))

    def _backoff(self, attempt: int, retry_after_s: float | None) -> float:
        jitter = self._rng.uniform(0.0, min(self._backoff_max_s, self._backoff_base_s * (2 ** attempt)))
        return max(jitter, retry_after_s or 0.0)

    def _account(self, r: ChatResponse, attempts: int) -> None:
        t = self._totals
        self._totals = UsageTotals(
            calls=t.calls + 1,
            ok_calls=t.ok_calls + (1 if r.ok else 0),
            failed_calls=t.failed_calls + (0 if r.ok else 1),
            attempts=t.attempts + attempts,
            retries=t.retries + attempts - 1,
            prompt_tokens=t.prompt_tokens + r.prompt_tokens,
            completion_tokens=t.completion_tokens + r.completion_tokens,
            cost_usd=t.cost_usd + r.cost_usd,
        )

    def _clean(self, text: str) -> str:
        return redact_text(text, extra_secrets=self._key.values())


__all__ = ["EndpointClient", "UsageTotals"]
