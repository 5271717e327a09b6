"""The one interface every pool member implements."""
from __future__ import annotations

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
