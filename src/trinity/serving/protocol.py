"""The OpenAI wire protocol of `trinity serve` (`trinity.serving.server` holds the app and its routes): errors in
the OpenAI error shape with their retry headers (`ApiError`) and those of an episode (`episode_error`,
`deadline_error`), the validation of a chat-completions body and its model (`parse_request`), and server-sent
events (their framing, the answer's content deltas, an episode's stream that cancels the episode when it ends
early, a client's disconnect).
"""
from __future__ import annotations

import asyncio
import json
import re
from typing import Any

from fastapi import Request
from fastapi.responses import StreamingResponse

from trinity.redact import redact_text
from trinity.serving.conversation import CANCELLED, NO_ANSWER, EpisodeResult, StopSignal, TurnRecord
from trinity.serving.openai_request import ChatRequest, RequestError, parse_chat_request

COORDINATOR_MODEL = "trinity"
CLIENT_LEFT = "the client disconnected"


class ApiError(Exception):
    """An error answered in the OpenAI shape. `retry`: whether asking again may succeed (the `x-should-retry`
    header the OpenAI SDKs obey); None: no header (the client's default). `retry_after_s`: the `Retry-After`
    header (whole seconds)."""

    def __init__(self, status: int, message: str, type_: str = "invalid_request_error", param: str | None = None,
                 code: str | None = None, extra: dict | None = None, retry: bool | None = None,
                 retry_after_s: int | None = None):
        super().__init__(message)
        self.status, self.message, self.type, self.param, self.code, self.extra = (
            status, message, type_, param, code, extra)
        if retry is None and 400 <= status < 500 and status not in (408, 409, 429):
            retry = False  # a client error is the same when asked again (the SDKs retry 408, 409 and 429)
        self.retry = retry
        self.retry_after_s = retry_after_s

    def headers(self) -> dict[str, str]:
        h = {"WWW-Authenticate": "Bearer"} if self.status == 401 else {}
        if self.retry is not None:
            h["x-should-retry"] = "true" if self.retry else "false"
        if self.retry_after_s is not None:
            h["Retry-After"] = str(self.retry_after_s)
        return h

    def body(self) -> dict:
        err = {"message": redact_text(self.message), "type": self.type, "param": self.param, "code": self.code}
        if self.extra:
            err.update(self.extra)
        return {"error": err}


def _sse(obj: Any) -> bytes:
    return f"data: {json.dumps(obj, ensure_ascii=False)}\n\n".encode()


def _content_pieces(text: str, words: int = 4) -> list[str]:
    """The answer as streamed content deltas: runs of `words` words, whitespace kept (they join to the text)."""
    tokens = re.findall(r"\s*\S+\s*|\s+", text)
    return ["".join(tokens[i:i + words]) for i in range(0, len(tokens), words)] or [""]


def episode_error(result: EpisodeResult) -> ApiError:
    """The API error of an episode without an answer: 502 for a pool failure, 500 for no answer, 503 for an episode
    cancelled while its client still waited (the server stopping); retryable only when a call failed for an outage
    or the episode was cancelled (asking again replays its stored turns)."""
    if result.outcome == CANCELLED:
        return ApiError(503, f"episode {result.episode_id} was {result.reason}", "server_error", code="cancelled",
                        extra={"trinity": result.summary()}, retry=True)
    if result.outcome == NO_ANSWER:
        return ApiError(500, f"the coordinator ended episode {result.episode_id} without an answer: {result.reason}",
                        "server_error", code="no_answer", extra={"trinity": result.summary()}, retry=False)
    failed = [{"member": m, "reason": why} for m, why in result.failures]
    return ApiError(502, f"episode {result.episode_id}: no answer; {result.reason}", "upstream_error",
                    code="pool_failure", extra={"members": failed, "trinity": result.summary()},
                    retry=not result.deterministic)


def deadline_error(episode_id: str, turns: list[TurnRecord], deadline_s: float) -> ApiError:
    """The 504 of a request not answered within `deadline_s` (`turns`: those its episode played)."""
    return ApiError(504, f"{episode_id} was not answered within the deadline of {deadline_s:g} s (trinity serve "
                         f"--deadline-s): its remaining turns are cancelled; the {len(turns)} call(s) it made, and any "
                         "in flight, are kept in the store, so asking again resumes from them", "timeout_error",
                    code="deadline_exceeded", retry=True,
                    extra={"trinity": {"episode_id": episode_id, "turns": [t.summary() for t in turns]}})


class _EpisodeStream(StreamingResponse):
    """An episode's server-sent events. However the response ends before the episode does — its client dropped
    the stream (the stream is cancelled, or never started), or the server stops — the episode's remaining turns
    are cancelled."""

    def __init__(self, content, episode: asyncio.Task, stop: StopSignal, **kwargs):
        super().__init__(content, **kwargs)
        self.episode, self.stop = episode, stop

    async def __call__(self, scope, receive, send) -> None:
        try:
            await super().__call__(scope, receive, send)
        finally:
            if not self.episode.done():
                self.stop.stop(CLIENT_LEFT)


async def _client_disconnected(request: Request) -> None:
    """Returns when the client closes the connection (its body has been read: nothing else can arrive)."""
    while (await request.receive())["type"] != "http.disconnect":
        pass


def parse_request(body: Any, models: list[str]) -> ChatRequest:
    """Validate a chat-completions body (`openai_request.parse_chat_request`) and its model."""
    try:
        req = parse_chat_request(body, COORDINATOR_MODEL)
    except RequestError as e:
        raise ApiError(400, str(e), param=e.param, code=e.code) from None
    if req.model not in models:
        raise ApiError(404, f"model {req.model!r} does not exist here; available: {', '.join(models)}", param="model",
                       code="model_not_found")
    return req
