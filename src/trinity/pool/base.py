"""The one interface every pool member implements (`ChatModel`), and the concurrency cap HTTP members share
(`LoopLocalSemaphore`; the pool's limits built from it: `runtime.ConcurrencyLimits`)."""
from __future__ import annotations

import asyncio
from typing import Protocol, Sequence, runtime_checkable

from trinity.records import ChatMessage, ChatResponse, SamplingParams


@runtime_checkable
class ChatModel(Protocol):
    """A pool member. `name` is the pool-local name (what the head's logits index);
    `model_id` identifies the weights/endpoint model and is part of every response-store key. A member may
    also define `request_identity(messages, sampling) -> dict`: whatever else shapes its reply to `messages` (a
    local member's rendered prompt, a constrained output format's grammar or schema, context size, runtime
    version); it joins the key too.

    `chat` never raises for model-side failures (timeouts, HTTP errors, malformed replies): it returns
    a ChatResponse with ok=False, the reason and the failure's kind (`ChatResponse.failure`: "transient" for an
    outage, which is not stored as the answer; "deterministic" when the request itself fails), so an episode
    can score 0 and the run goes on.
    """

    name: str
    model_id: str

    async def chat(self, messages: Sequence[ChatMessage], sampling: SamplingParams) -> ChatResponse: ...


class LoopLocalSemaphore:
    """A concurrency cap shared by several callers, re-created for each event loop it is used in (an asyncio
    semaphore belongs to one loop; training runs one loop per generation)."""

    def __init__(self, value: int):
        self.value = value
        self._loop: asyncio.AbstractEventLoop | None = None
        self._sem: asyncio.Semaphore | None = None

    def get(self) -> asyncio.Semaphore:
        loop = asyncio.get_running_loop()
        if self._sem is None or loop is not self._loop:
            self._loop, self._sem = loop, asyncio.Semaphore(self.value)
        return self._sem
