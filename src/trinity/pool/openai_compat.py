"""Pool backend for any OpenAI-compatible chat-completions endpoint (OpenAI, Anthropic's and Gemini's
compatible endpoints, vLLM, SGLang, Ollama, llama.cpp server, ...).

The member says what to ask: a chat completion of the messages with the sampling settings (`request`), under the
member's model name, and what of it keys a stored reply (`request_identity`). It holds the client that asks:
`trinity.pool.openai_client.EndpointClient`, the one HTTP call path of the pool (the llama-server member holds one
too), with the member's settings — its slot of the pool's limits (`member.max_concurrency`, `member_limit`) and the
pool-wide one (`global_limit`), `member.timeout_s` per attempt, `member.max_retries` more attempts for what an
outage looks like, the member's prices for each reply's cost — and its policy (retries and backoff, Retry-After,
the kind of each failure, the books: `totals`). `latency_s` of a ChatResponse is the whole call, retries and
backoff included; `model` is this member's `model_id`.

An output format (`SamplingParams.output_format`) is sent as `response_format`
(`openai_wire.output_response_format`): a "verdict" request (the Verifier's) asks for OpenAI structured
outputs, a JSON object {"reason": str, "verdict": "ACCEPT" | "REJECT"} under a strict JSON schema (the
form vLLM, SGLang, Ollama and llama.cpp's server accept too); the reply text is that JSON, which
`trinity.verdict.parse_verdict` reads. The response_format is part of the request's identity
(`request_identity`), hence of its store key.

Secrets: the API key is read from os.environ[member.api_key_env] once, at construction, and handed to the client:
it lives only in the SDK client and in a holder whose repr is masked (`openai_transport._Secret`, used to scrub
error texts); it is in no repr, and every error text that leaves the client goes through `trinity.redact` with
the key as an explicit secret (a proxy that echoes the Authorization header in an error body is scrubbed too).

Beside it: `trinity.pool.openai_client` (the client), `trinity.pool.openai_wire` (the output format's
response_format; reading replies and errors: usage, Retry-After, error messages and codes) and
`trinity.pool.openai_transport` (the SDK's HTTP transport, closing a client with its event loop, the key's masked
holder, the public URL).
"""
from __future__ import annotations

import asyncio
import random
from typing import Any, Awaitable, Callable, Literal, Sequence

from trinity.config import PoolMember
from trinity.pool.base import LoopLocalSemaphore
from trinity.pool.errors import PoolConfigError, api_key_from_env
from trinity.pool.openai_client import EndpointClient, UsageTotals
from trinity.pool.openai_transport import _public_url
from trinity.pool.openai_wire import output_response_format
from trinity.records import ChatMessage, ChatResponse, SamplingParams
from trinity.redact import register_secret_env_names


class OpenAICompatibleChatModel:
    """A `ChatModel` backed by an OpenAI-compatible endpoint. See the module docstring.

    `backoff_base_s`, `backoff_max_s`, `max_retry_after_s`, `transport`, `rng` and `sleep` go to the client
    (`EndpointClient`: the retry delays, the HTTP transport, deterministic or fast backoff for tests).
    `member_limit`: the pool's slot of this member (`ConcurrencyLimits.per_member`), else a semaphore of its own.
    Use the model inside one event loop and `await aclose()` when done.
    """

    def __init__(
        self,
        member: PoolMember,
        global_limit: asyncio.Semaphore | LoopLocalSemaphore | None = None,
        *,
        member_limit: LoopLocalSemaphore | None = None,
        backoff_base_s: float = 0.5,
        backoff_max_s: float = 30.0,
        max_retry_after_s: float = 120.0,
        transport: Literal["auto", "aiohttp", "httpx"] = "auto",
        rng: random.Random | None = None,
        sleep: Callable[[float], Awaitable[Any]] = asyncio.sleep,
    ) -> None:
        if member.backend != "openai":
            raise PoolConfigError(f"pool member {member.name!r}: backend is {member.backend!r}, "
                                  f"OpenAICompatibleChatModel needs backend 'openai'")
        if not member.base_url:
            raise PoolConfigError(f"pool member {member.name!r}: backend 'openai' needs base_url")
        if member.max_concurrency < 1:
            raise PoolConfigError(f"pool member {member.name!r}: max_concurrency must be >= 1")
        register_secret_env_names([member.api_key_env])
        key = api_key_from_env(member)  # raises MissingApiKeyError naming member and env var

        self.name = member.name
        self.model_id = f"openai-compatible:{member.model}@{_public_url(member.base_url)}"
        """Endpoint model name + endpoint: the same name on two servers may be different weights."""
        self.member = member
        self.client = EndpointClient(
            name=member.name, model_id=self.model_id, base_url=member.base_url, api_key=key,
            timeout_s=member.timeout_s, max_retries=member.max_retries,
            member_limit=member_limit if member_limit is not None else LoopLocalSemaphore(member.max_concurrency),
            global_limit=global_limit, prices=(member.price_input_per_mtok, member.price_output_per_mtok),
            backoff_base_s=backoff_base_s, backoff_max_s=backoff_max_s, max_retry_after_s=max_retry_after_s,
            transport=transport, rng=rng, sleep=sleep)
        """The one HTTP client of this member: its SDK client (one per event loop), limits, retries and books."""
        del key

    # -- public ----------------------------------------------------------------------------------
    def __repr__(self) -> str:
        return (f"OpenAICompatibleChatModel(name={self.name!r}, model={self.member.model!r}, "
                f"base_url={_public_url(self.member.base_url or '')!r}, "
                f"max_concurrency={self.member.max_concurrency})")

    @property
    def totals(self) -> UsageTotals:
        """This member's books: its client's calls, attempts, tokens and cost."""
        return self.client.totals

    def reset_totals(self) -> None:
        self.client.reset_totals()

    def request_identity(self, messages: Sequence[ChatMessage], sampling: SamplingParams) -> dict:
        """What, besides model_id, messages and sampling, shapes the reply: the response_format of an output
        format (so editing the schema asks again). Empty for a free-text request: its key is model, messages
        and sampling alone."""
        response_format = self._response_format(sampling)
        return {} if response_format is None else {"response_format": response_format}

    def _response_format(self, sampling: SamplingParams) -> dict[str, Any] | None:
        """The response_format this request sends: the output format's, unless the member turns it off
        (`PoolMember.structured_output: false`: the prompt alone asks for the field)."""
        return output_response_format(sampling) if self.member.structured_output else None

    def default_sampling(self, seed: int = 0) -> SamplingParams:
        """Sampling parameters from the member's settings."""
        m = self.member
        return SamplingParams(temperature=m.temperature, top_p=m.top_p, max_tokens=m.max_tokens, seed=seed)

    async def aclose(self) -> None:
        """Close the HTTP client, on the loop it belongs to (a pool's members live on the pool's HTTP loop)."""
        await self.client.aclose()

    async def __aenter__(self) -> "OpenAICompatibleChatModel":
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()

    async def chat(self, messages: Sequence[ChatMessage], sampling: SamplingParams) -> ChatResponse:
        """One chat completion, asked by the client (retried per its policy). Never raises for model-side failures."""
        route, body = self.request(messages, sampling)
        return await self.client.call(route, body)

    def request(self, messages: Sequence[ChatMessage], sampling: SamplingParams) -> tuple[str, dict[str, Any]]:
        """The route (relative to base_url) and JSON body of one call: a chat completion with the sampling
        settings, and the output format's response_format if any. (`trinity.pool.llama_server.server_request` asks
        its server for a completion where the member is a base model, and adds llama.cpp's own fields.)"""
        body: dict[str, Any] = {
            "model": self.member.model,
            "messages": [{"role": m.role, "content": m.content} for m in messages],
            "temperature": sampling.temperature,
            "top_p": sampling.top_p,
            "max_tokens": sampling.max_tokens,
            "seed": sampling.seed,
        }
        response_format = self._response_format(sampling)
        if response_format is not None:
            body["response_format"] = response_format
        return "/chat/completions", body


__all__ = ["OpenAICompatibleChatModel"]
