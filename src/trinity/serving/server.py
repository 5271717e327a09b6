"""`trinity serve`: the trained coordinator as one OpenAI-compatible model (FastAPI + uvicorn).

Routes:
- `GET /v1/models`: `trinity` (the coordinator) and every pool member (callable directly, bypassing it);
  `GET /v1/models/{id}` one of them.
- `GET /health`: liveness and what is served (no API key needed: for probes; it reveals no secret).
- `POST /v1/chat/completions` (the body is a pydantic model, `openai_request.ChatCompletionRequest`; which fields
  are honoured, refused or ignored: `openai_request`'s doc):
    * `model: "trinity"` plays one episode over the whole message list (`messages.task_from_messages`) and
      returns the final Worker answer in the standard shape; `usage` is summed over every pool call of the
      episode (as recorded when paid: a stored reply keeps its figures); the `trinity` field is the trace
      (`EpisodeResult.summary`: episode id, who answered, per turn model / role / tokens / latency / verdict /
      stored). Extension: `answer_format` (free, math, choice, code; default free).
    * a member's name: one call to that member (through the response store).
    * `max_tokens` / `max_completion_tokens` cap the answer; `finish_reason` is "length" when the answer's reply
      reached its cap, else "stop".
    * `stream: true`: server-sent events in the chat.completion.chunk format: a role chunk at once, one chunk per
      turn as its reply arrives (empty delta, the turn in the extra field `trinity.turn`), the answer as content
      deltas, a final chunk with the finish_reason and the trace, the usage chunk when
      `stream_options.include_usage`, then `data: [DONE]`. A failure after the stream started is an `error` event.
- Errors, in the OpenAI error shape `{"error": {"message", "type", "param", "code"}}`: malformed JSON 400,
  missing / empty / malformed messages 400, a field of the wrong type or a refused one (tools, structured outputs,
  logprobs, n > 1) 400 naming it, unknown model 404, body over `max_body_bytes` 413, a missing or wrong bearer
  token 401 (when `TRINITY_API_KEY` is set), a pool failure 502 (the members and reasons), an episode that ended
  without an answer 500 (code `no_answer`), too many requests in flight 429, a request past its deadline 504, an
  episode cancelled while its client waited (the server stopping) 503. A failure that asking again would repeat
  (every other 4xx, no answer, a member's deterministic failure) carries `x-should-retry: false`, so the OpenAI
  SDKs do not retry it; a pool outage, a 429, a 504 and a 503 carry `x-should-retry: true`.

Protection (`create_app`'s `max_in_flight` and `deadline_s`; `trinity serve --max-in-flight`, `--deadline-s`):
- Admission: at most `max_in_flight` chat completions (episodes and direct member calls) run at once, counting
  those whose clients have left until their last call returns. One more gets 429 at once (code
  `too_many_requests_in_flight`) with `Retry-After` (about one request's time: the median duration of the last
  finished ones, 1 to 60 s) and `x-should-retry: true`: the OpenAI SDKs wait that long and retry.
- Deadline: a request not answered `deadline_s` after it arrived gets 504 (code `deadline_exceeded`; streaming: an
  `error` event, then `data: [DONE]`), with the episode's id and the turns it played; the episode's remaining
  turns are cancelled.
- A client that disconnects (a non-streaming request's connection closed, or a stream dropped) cancels the
  episode's remaining turns.
- Cancelling (`conversation.StopSignal`) starts no further turn; the call in flight is not interrupted (a
  concurrent request may share it): it finishes and is stored, like every call already paid, so asking again
  replays them and pays only for the rest. The trace is kept with outcome `cancelled`. At shutdown every running
  episode is cancelled the same way and the server waits (up to SHUTDOWN_WAIT_S) for the calls in flight.
- Binding beyond loopback without an API key is refused (`security.check_exposure`) unless explicitly allowed
  (`trinity serve --allow-unauthenticated`): anyone reaching the port could spend the pool's paid members.

Concurrency: one process, one event loop, one `Coordinator` — one pool (requests stored or in flight are shared,
not repeated), one encoder, one store (this process is its only writer). An episode runs as a task of its own
(the request's handler waits for it, its client's disconnect and its deadline). Episodes play on threads of their
own (`Coordinator.answer`), so an encode never holds the event loop.

The API key is compared in constant time and never logged, traced or stored: it is registered with
`tracking_redact` and every log line goes through its `RedactingFilter` (`trinity.serving.security`).

Beside it: `trinity.serving.protocol` (the OpenAI error shape `ApiError` and the episodes' errors, the request's
validation, the server-sent events' framing) and `trinity.serving.security` (the API key, logging, the exposure check).
"""
from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import math
import secrets
import signal
import statistics
import time
import uuid
from collections import deque
from typing import Any, Callable

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, StreamingResponse
from starlette.exceptions import HTTPException as StarletteHTTPException

from trinity.serving.conversation import ANSWERED, Coordinator, EpisodeResult, StopSignal, TurnRecord
from trinity.serving.messages import ConversationError, chat_messages, task_from_messages
from trinity.serving.openai_request import IGNORED_FIELDS_HEADER, ChatRequest
from trinity.serving.protocol import (CLIENT_LEFT, COORDINATOR_MODEL, ApiError, _client_disconnected, _content_pieces,
                                      _EpisodeStream, _sse, deadline_error, episode_error, parse_request)
from trinity.serving.security import api_key_from_env, check_exposure, configure_logging, is_loopback

log = logging.getLogger("trinity.serving.server")

DEFAULT_MAX_BODY_BYTES = 1_000_000
DEFAULT_MAX_IN_FLIGHT = 32
"""Chat completions running at once by default (beyond: 429). Each episode holds one of the coordinator's
EPISODE_THREADS threads and, per turn, a slot of its member's `max_concurrency`: raise it for a pool with many
slots (a remote GPU server), lower it for the embedded CPU pool."""
DEFAULT_DEADLINE_S = 600.0
"""A request's deadline by default (beyond: 504): the OpenAI SDKs' default timeout, after which their client has
left anyway."""
SHUTDOWN_WAIT_S = 60.0
"""At shutdown, how long the calls still in flight (their episodes cancelled) may take to finish into the store."""
RETRY_AFTER_BOUNDS_S = (1, 60)
"""A 429's Retry-After, in whole seconds: the median duration of the last finished requests, within these (the
OpenAI SDKs honour up to 60 s)."""


def create_app(coordinator: Coordinator, *, api_key: str | None = None,
               max_body_bytes: int = DEFAULT_MAX_BODY_BYTES, max_in_flight: int = DEFAULT_MAX_IN_FLIGHT,
               deadline_s: float = DEFAULT_DEADLINE_S):
    """The FastAPI app serving `coordinator`. `api_key`: the bearer token every request must carry (None: open).
    `max_in_flight`: chat completions running at once (beyond: 429); `deadline_s`: a request's deadline (beyond:
    504, the episode's remaining turns cancelled) — module doc, "Protection"."""
    if isinstance(max_in_flight, bool) or not isinstance(max_in_flight, int) or max_in_flight < 1:
        raise ValueError(f"max_in_flight (trinity serve --max-in-flight) must be an integer >= 1, "
                         f"got {max_in_flight!r}")
    if isinstance(deadline_s, bool) or not isinstance(deadline_s, (int, float)) or not math.isfinite(deadline_s) \
            or deadline_s <= 0:
        raise ValueError(f"deadline_s (trinity serve --deadline-s) must be a number of seconds > 0, got {deadline_s!r}")
    running: dict[asyncio.Task, StopSignal | None] = {}  # episodes (their stop) and member calls in flight
    finished_s: deque[float] = deque(maxlen=20)  # how long the last requests took (→ Retry-After)

    @contextlib.asynccontextmanager
    async def lifespan(app):
        yield
        if running:  # at shutdown: no further turn; the calls in flight finish into the store
            log.info("cancelling %d request(s) in flight; waiting for their calls", len(running))
            for stop in running.values():
                if stop is not None:
                    stop.stop("the server stopped")
            await asyncio.wait(list(running), timeout=SHUTDOWN_WAIT_S)

    app = FastAPI(title="Trinity", description="The trained coordinator as one OpenAI-compatible model",
                  docs_url=None, redoc_url=None, openapi_url=None, lifespan=lifespan)
    models = [COORDINATOR_MODEL, *coordinator.pool.names]
    app.state.coordinator, app.state.running = coordinator, running
    token = api_key.encode() if api_key else None

    def error_response(e: ApiError) -> JSONResponse:
        return JSONResponse(e.body(), status_code=e.status, headers=e.headers())

    @app.exception_handler(ApiError)
    async def _api_error(request: Request, e: ApiError):
        return error_response(e)

    @app.exception_handler(StarletteHTTPException)
    async def _http_error(request: Request, e: StarletteHTTPException):
        return error_response(ApiError(e.status_code, str(e.detail), code="not_found" if e.status_code == 404 else None))

    @app.exception_handler(Exception)
    async def _unexpected(request: Request, e: Exception):
        log.error("unexpected error on %s: %s: %s", request.url.path, type(e).__name__, e, exc_info=e)
        return error_response(ApiError(500, f"internal error: {type(e).__name__}: {e}", "server_error",
                                       code="internal_error"))

    def check_auth(request: Request) -> None:
        if token is None:
            return
        got = request.headers.get("authorization", "")
        scheme, _, value = got.partition(" ")
        if scheme.lower() != "bearer" or not secrets.compare_digest(value.strip().encode(), token):
            raise ApiError(401, "missing or wrong API key: send 'Authorization: Bearer <TRINITY_API_KEY>'",
                           "authentication_error", code="invalid_api_key")

    async def read_json(request: Request) -> Any:
        declared = request.headers.get("content-length")
        if declared is not None and declared.isdigit() and int(declared) > max_body_bytes:
            raise ApiError(413, f"request body of {declared} bytes exceeds the limit of {max_body_bytes} bytes "
                                "(trinity serve --max-body-bytes)", code="request_too_large")
        chunks, size = [], 0
        async for chunk in request.stream():
            size += len(chunk)
            if size > max_body_bytes:
                raise ApiError(413, f"request body exceeds the limit of {max_body_bytes} bytes "
                                    "(trinity serve --max-body-bytes)", code="request_too_large")
            chunks.append(chunk)
        raw = b"".join(chunks)
        if not raw.strip():
            raise ApiError(400, "the request body is empty: expected a JSON object", code="invalid_json")
        try:
            return json.loads(raw)
        except (json.JSONDecodeError, UnicodeDecodeError) as e:
            raise ApiError(400, f"the request body is not valid JSON: {e}", code="invalid_json") from None

    def model_card(name: str) -> dict:
        return {"id": name, "object": "model", "created": 0,
                "owned_by": "trinity" if name == COORDINATOR_MODEL else "trinity-pool"}

    @app.get("/health")
    async def health():
        return {"status": "ok", "models": models, "checkpoint": coordinator.checkpoint_id,
                "in_flight": len(running), "max_in_flight": max_in_flight, "deadline_s": deadline_s}

    @app.get("/v1/models")
    async def list_models(request: Request):
        check_auth(request)
        return {"object": "list", "data": [model_card(m) for m in models]}

    @app.get("/v1/models/{model_id}")
    async def get_model(model_id: str, request: Request):
        check_auth(request)
        if model_id not in models:
            raise ApiError(404, f"model {model_id!r} does not exist here; available: {', '.join(models)}",
                           param="model", code="model_not_found")
        return model_card(model_id)

    def retry_after_s() -> int:
        lo, hi = RETRY_AFTER_BOUNDS_S
        return min(hi, max(lo, math.ceil(statistics.median(finished_s)))) if finished_s else lo

    def admit(work: Callable[[], Any], stop: StopSignal | None = None) -> asyncio.Task:
        """Start `work()` as a task of its own (kept until done), or a 429 when `max_in_flight` run already. No
        await between the count and the start: the limit holds however many requests arrive at once."""
        if len(running) >= max_in_flight:
            wait = retry_after_s()
            raise ApiError(429, f"{len(running)} requests are in flight, this server's limit (trinity serve "
                                f"--max-in-flight {max_in_flight}): retry after {wait} s", "rate_limit_error",
                           code="too_many_requests_in_flight", retry=True, retry_after_s=wait)
        t0 = time.perf_counter()
        t = asyncio.ensure_future(work())
        running[t] = stop

        def done(_):
            running.pop(t, None)
            finished_s.append(time.perf_counter() - t0)

        t.add_done_callback(done)
        return t

    async def answered(work: asyncio.Task, request: Request, t0: float, stop: StopSignal | None,
                       on_deadline: Callable[[], ApiError]):
        """`work`'s result once done; `on_deadline()` raised when the request's deadline passes first; a 499 when
        the client disconnects first. Either way `stop` (an episode's) cancels its remaining turns; a member call
        (no stop) finishes into the store."""
        left = asyncio.ensure_future(_client_disconnected(request))
        try:
            done, _ = await asyncio.wait({work, left}, timeout=max(0.0, t0 + deadline_s - time.perf_counter()),
                                         return_when=asyncio.FIRST_COMPLETED)
        except asyncio.CancelledError:  # the handler itself is cancelled (the server stops)
            if stop is not None:
                stop.stop("the request was cancelled")
            raise
        finally:
            left.cancel()
        if work in done:
            return work.result()
        if left in done:
            if stop is not None:
                stop.stop(CLIENT_LEFT)
            log.info("%s before the answer: %s", CLIENT_LEFT,
                     "the episode's remaining turns are cancelled" if stop is not None else "the call goes on")
            raise ApiError(499, f"{CLIENT_LEFT} before the answer", code="client_closed_request")
        if stop is not None:
            stop.stop(f"the deadline of {deadline_s:g} s passed")
        log.info("the deadline of %g s passed before the answer: %s", deadline_s,
                 "the episode's remaining turns are cancelled" if stop is not None else "the call goes on")
        raise on_deadline()

    def reply_headers(req: ChatRequest) -> dict[str, str]:
        return {IGNORED_FIELDS_HEADER: ",".join(req.ignored)} if req.ignored else {}

    @app.post("/v1/chat/completions")
    async def chat_completions(request: Request):
        t0 = time.perf_counter()
        check_auth(request)
        req = parse_request(await read_json(request), models)
        try:
            if req.model == COORDINATOR_MODEL:
                task = task_from_messages(req.messages, req.answer_format)
            else:
                messages = chat_messages(req.messages)
        except ConversationError as e:
            raise ApiError(400, str(e), param=e.param, code="invalid_messages") from None
        created = int(time.time())
        if req.model != COORDINATOR_MODEL:
            return await member_completion(request, req, messages, created, t0)
        stop = StopSignal()
        episode_id = coordinator.episode_id(task, req.max_tokens)
        if req.stream:
            turns: asyncio.Queue = asyncio.Queue()
            episode = admit(lambda: coordinator.answer(task, turns.put_nowait, req.max_tokens, stop), stop)
            episode.add_done_callback(lambda _: turns.put_nowait(None))
            return _EpisodeStream(stream_episode(episode, turns, stop, episode_id, req, created, t0), episode, stop,
                                  media_type="text/event-stream",
                                  headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no",
                                           **reply_headers(req)})
        played: list[TurnRecord] = []
        episode = admit(lambda: coordinator.answer(task, played.append, req.max_tokens, stop), stop)
        result = await answered(episode, request, t0, stop, lambda: deadline_error(episode_id, played, deadline_s))
        log_episode(result, t0)
        if result.outcome != ANSWERED:
            raise episode_error(result)
        return JSONResponse(completion_body(result, created), headers=reply_headers(req))

    def completion_body(result: EpisodeResult, created: int) -> dict:
        return {"id": f"chatcmpl-{result.episode_id}", "object": "chat.completion", "created": created,
                "model": COORDINATOR_MODEL,
                "choices": [{"index": 0, "message": {"role": "assistant", "content": result.answer},
                             "finish_reason": result.finish_reason}],
                "usage": result.usage, "trinity": result.summary()}

    def log_episode(result: EpisodeResult, t0: float) -> None:
        log.info("%s %s: %d turn(s), %d fresh repl(ies), %d from the store, answered by %s, %.2fs",
                 result.episode_id, result.outcome, len(result.turns), result.summary()["fresh_replies"],
                 result.summary()["stored_replies"], result.answered_by, time.perf_counter() - t0)

    async def member_completion(request: Request, req: ChatRequest, messages, created: int, t0: float):
        model = req.model
        call = admit(lambda: coordinator.ask_member(model, messages, req.max_tokens))
        turn = await answered(call, request, t0, None, lambda: ApiError(
            504, f"the call to pool member {model!r} did not return within the deadline of {deadline_s:g} s (trinity "
                 "serve --deadline-s): it goes on, and its reply is kept in the store, so asking again returns it",
            "timeout_error", code="deadline_exceeded", retry=True))
        log.info("direct %s: %s, stored=%s, %.2fs", model, "ok" if turn.ok else "failed", turn.stored,
                 time.perf_counter() - t0)
        if not turn.ok:
            raise ApiError(502, f"pool member {model!r} failed: {turn.error}", "upstream_error",
                           code="pool_failure", extra={"members": [{"member": model, "reason": turn.error}]},
                           retry=turn.failure == "transient")
        usage = {"prompt_tokens": turn.prompt_tokens, "completion_tokens": turn.completion_tokens,
                 "total_tokens": turn.prompt_tokens + turn.completion_tokens}
        trace = {"turns": [turn.summary()], "answered_by": model}
        cid = f"chatcmpl-{uuid.uuid4().hex[:24]}"
        if not req.stream:
            return JSONResponse({"id": cid, "object": "chat.completion", "created": created, "model": model,
                                 "choices": [{"index": 0, "message": {"role": "assistant", "content": turn.text},
                                              "finish_reason": turn.finish_reason}], "usage": usage, "trinity": trace},
                                headers=reply_headers(req))

        async def events():
            yield _sse(chunk(cid, created, model, {"role": "assistant", "content": ""}))
            for piece in _content_pieces(turn.text):
                yield _sse(chunk(cid, created, model, {"content": piece}))
            yield _sse({**chunk(cid, created, model, {}, turn.finish_reason), "trinity": trace})
            if req.include_usage:
                yield _sse({"id": cid, "object": "chat.completion.chunk", "created": created, "model": model,
                            "choices": [], "usage": usage})
            yield b"data: [DONE]\n\n"

        return StreamingResponse(events(), media_type="text/event-stream",
                                 headers={"Cache-Control": "no-cache", **reply_headers(req)})

    def chunk(cid: str, created: int, model: str, delta: dict, finish: str | None = None) -> dict:
        return {"id": cid, "object": "chat.completion.chunk", "created": created, "model": model,
                "choices": [{"index": 0, "delta": delta, "finish_reason": finish}]}

    async def stream_episode(episode: asyncio.Task, turns: asyncio.Queue, stop: StopSignal, episode_id: str,
                             req: ChatRequest, created: int, t0: float):
        """The events of `episode` (its turns arrive on `turns`, then None); at the deadline an error event."""
        cid = f"chatcmpl-{episode_id}"
        yield _sse(chunk(cid, created, COORDINATOR_MODEL, {"role": "assistant", "content": ""}))
        played: list[TurnRecord] = []
        while True:
            try:
                turn = await asyncio.wait_for(turns.get(), timeout=max(0.0, t0 + deadline_s - time.perf_counter()))
            except asyncio.TimeoutError:
                stop.stop(f"the deadline of {deadline_s:g} s passed")
                yield _sse(deadline_error(episode_id, played, deadline_s).body())
                yield b"data: [DONE]\n\n"
                return
            if turn is None:
                break
            played.append(turn)
            yield _sse({**chunk(cid, created, COORDINATOR_MODEL, {}), "trinity": {"turn": turn.summary()}})
        try:
            result = episode.result()
        except Exception as e:  # noqa: BLE001 - the stream has started: the error goes out as an event
            log.error("episode failed: %s: %s", type(e).__name__, e, exc_info=e)
            yield _sse(ApiError(500, f"internal error: {type(e).__name__}: {e}", "server_error",
                                code="internal_error").body())
            yield b"data: [DONE]\n\n"
            return
        log_episode(result, t0)
        if result.outcome != ANSWERED:
            yield _sse(episode_error(result).body())
            yield b"data: [DONE]\n\n"
            return
        for piece in _content_pieces(result.answer):
            yield _sse(chunk(cid, created, COORDINATOR_MODEL, {"content": piece}))
        yield _sse({**chunk(cid, created, COORDINATOR_MODEL, {}, result.finish_reason), "trinity": result.summary()})
        if req.include_usage:
            yield _sse({"id": cid, "object": "chat.completion.chunk", "created": created, "model": COORDINATOR_MODEL,
                        "choices": [], "usage": result.usage})
        yield b"data: [DONE]\n\n"

    return app


def run_server(coordinator: Coordinator, host: str = "127.0.0.1", port: int = 8000, *,
               max_body_bytes: int = DEFAULT_MAX_BODY_BYTES, max_in_flight: int = DEFAULT_MAX_IN_FLIGHT,
               deadline_s: float = DEFAULT_DEADLINE_S, allow_unauthenticated: bool = False, log_level: str = "info",
               on_ready=None) -> None:
    """Serve until interrupted (uvicorn, one worker: the store has one writer). `on_ready(port)` runs once bound.
    An ExposureError (`check_exposure`) before anything is bound when `host` is beyond loopback without an API key
    and not `allow_unauthenticated`."""
    import uvicorn

    api_key = api_key_from_env()
    check_exposure(host, api_key, allow_unauthenticated)
    configure_logging(log_level)
    app = create_app(coordinator, api_key=api_key, max_body_bytes=max_body_bytes, max_in_flight=max_in_flight,
                     deadline_s=deadline_s)
    config = uvicorn.Config(app, host=host, port=port, log_config=None, log_level=log_level, access_log=True,
                            timeout_graceful_shutdown=5)
    server = uvicorn.Server(config)

    async def main() -> None:
        serving = asyncio.ensure_future(server.serve())
        while not server.started and not serving.done():
            await asyncio.sleep(0.05)
        if server.started:
            bound = server.servers[0].sockets[0].getsockname()[1] if server.servers else port
            log.info("serving %s on http://%s:%d/v1 (models: %s; auth %s; at most %d in flight, deadline %g s; "
                     "traces kept %s)", coordinator.checkpoint_path, host, bound,
                     ", ".join([COORDINATOR_MODEL, *coordinator.pool.names]), "on" if api_key else "off",
                     max_in_flight, deadline_s, f"{coordinator.traces.retention_days:g} days"
                     if coordinator.traces.retention_days is not None else "forever")
            if not api_key and not is_loopback(host):
                log.warning("auth is off on %s (--allow-unauthenticated): anyone who reaches it can call the pool",
                            host)
            if on_ready is not None:
                on_ready(bound)
        await serving

    def terminate(signum, frame):
        raise KeyboardInterrupt

    # uvicorn shuts down gracefully on SIGINT / SIGTERM, then raises the signal again: both end here as a
    # KeyboardInterrupt, so the caller closes the store and the process exits 0.
    previous = signal.signal(signal.SIGTERM, terminate)
    try:
        asyncio.run(main())
    except KeyboardInterrupt:
        pass
    finally:
        signal.signal(signal.SIGTERM, previous)
    log.info("stopped")
