"""The one interface every pool member implements, and the pool's one concurrency limit."""
from __future__ import annotations

import asyncio
import contextlib
from typing import TYPE_CHECKING, AsyncIterator, Protocol, Sequence, runtime_checkable

from trinity.records import ChatMessage, ChatResponse, SamplingParams

if TYPE_CHECKING:
    from trinity.config import PoolMember


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


def over_http(member: "PoolMember") -> bool:
    """Whether the member's calls go over HTTP (OpenAI-compatible endpoint, or llama-server for a local model)."""
    return member.backend == "openai" or member.engine == "llama-server"


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


class ConcurrencyLimits:
    """The pool's one concurrency limit: at most `pool.max_concurrency` calls in flight in all (`total`), and at
    most `member.max_concurrency` per member called over HTTP (`per_member[idx]`: an OpenAI-compatible member, or a
    local member served by llama-server, whose slots it is; None for a local member run in process, whose calls a
    lock per loaded model already serialises: one at a time per model and process).

    The same semaphores serve every path (`build_members` hands them to the HTTP members; the task-runner
    executor acquires them per submitted request):
    - in process, an HTTP member holds its slots only while a request is on the wire, never while backing off
      (`trinity.pool.openai_compat`);
    - through a task runner (Prefect threads, Dask workers), the main process holds a request's slots from
      submission until its reply is back, so the limits hold across every worker process (a worker does not
      know what the others run)."""

    def __init__(self, total: int | None, members: Sequence["PoolMember"]):
        self.total = LoopLocalSemaphore(total) if total else None
        self.per_member: list[LoopLocalSemaphore | None] = [
            LoopLocalSemaphore(m.max_concurrency) if over_http(m) else None for m in members]

    @contextlib.asynccontextmanager
    async def slot(self, idx: int) -> AsyncIterator[None]:
        """Member `idx`'s slot, then one of the pool-wide slots (the order HTTP members take them in)."""
        member = self.per_member[idx]
        async with (member.get() if member is not None else contextlib.nullcontext()), \
                (self.total.get() if self.total is not None else contextlib.nullcontext()):
            yield
