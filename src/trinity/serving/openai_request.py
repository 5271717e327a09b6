"""The chat-completions request as OpenAI clients send it (the openai SDK, LangChain's `ChatOpenAI`, LiteLLM, ...),
validated by a pydantic model, and what `trinity serve` does with each field.

The policy, field by field:

- **honoured**: `model`, `messages`, `stream`, `stream_options.include_usage`, `n` (1 only), `answer_format` (an
  extension, model `trinity` only), and `max_completion_tokens` / `max_tokens` (the smaller when both are sent):
  it caps the answer, i.e. every Worker turn of the episode (Thinker and Verifier turns keep their own caps) or
  the direct call of a member; a member's own lower `max_tokens` still applies. An answer cut at its cap has
  finish_reason "length".
- **refused** with a 400 that names the field, because an episode cannot give what they ask for: `tools` and
  `functions` (non-empty), `tool_choice` / `function_call` other than "none", `response_format` other than
  `{"type": "text"}` (structured outputs), `logprobs: true` and `top_logprobs`, `modalities` other than text,
  `audio`, and `n` other than 1.
- **ignored** (accepted and not applied; the response header `x-trinity-ignored-fields` lists the ones a request
  sent): every other field. Sampling fields (`temperature`, `top_p`, `seed`, `stop`, `frequency_penalty`,
  `presence_penalty`, `logit_bias`, ...) because each member samples with the settings of the params file, those
  the coordinator was trained with and the response store is keyed by; bookkeeping fields (`user`, `metadata`,
  `store`, `service_tier`, `parallel_tool_calls`, ...) because they change nothing here; and fields this server
  does not know, as vLLM does.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from trinity.serving.messages import ANSWER_FORMATS

IGNORED_FIELDS_HEADER = "x-trinity-ignored-fields"


class RequestError(ValueError):
    """A request this server refuses (400): `param` names the field."""

    def __init__(self, message: str, param: str | None, code: str):
        super().__init__(message)
        self.param, self.code = param, code


class _StreamOptions(BaseModel):
    model_config = ConfigDict(extra="ignore", strict=True)
    include_usage: bool = False


class ChatCompletionRequest(BaseModel):
    """The fields this server reads or refuses; any other field is kept (`model_extra`) and ignored."""

    model_config = ConfigDict(extra="allow", strict=True)

    model: str = Field(min_length=1)
    messages: Any = None  # checked by `messages.chat_messages`, which names the message and field at fault
    stream: bool | None = None
    stream_options: _StreamOptions | None = None
    n: int | None = None
    max_tokens: int | None = Field(None, ge=1)
    max_completion_tokens: int | None = Field(None, ge=1)
    answer_format: Literal[tuple(ANSWER_FORMATS)] | None = None  # type: ignore[valid-type]
    tools: list[Any] | None = None
    functions: list[Any] | None = None
    tool_choice: str | dict | None = None
    function_call: str | dict | None = None
    response_format: dict | None = None
    logprobs: bool | None = None
    top_logprobs: int | None = None
    modalities: list[str] | None = None
    audio: Any = None


@dataclass(frozen=True)
class ChatRequest:
    """A validated request: what the server does with it."""

    model: str
    messages: Any
    stream: bool
    include_usage: bool
    answer_format: str
    max_tokens: int | None
    ignored: tuple[str, ...]


def _refuse(field: str, why: str) -> RequestError:
    return RequestError(f"'{field}' is not supported: {why}", field, "unsupported_parameter")


def parse_chat_request(body: Any, coordinator_model: str) -> ChatRequest:
    """Validate a chat-completions body (policy: module doc). Raises RequestError naming the field."""
    if not isinstance(body, dict):
        raise RequestError(f"the request body must be a JSON object, got {type(body).__name__}", None, "invalid_body")
    if not body.get("model"):
        raise RequestError("'model' is required: 'trinity' or a pool member's name", "model", "missing_model")
    try:
        req = ChatCompletionRequest.model_validate(body)
    except ValidationError as e:
        err = e.errors()[0]
        where = ".".join(str(p) for p in err["loc"]) or None
        got = f", got {err['input']!r}" if "input" in err and not isinstance(err["input"], (dict, list)) else ""
        raise RequestError(f"'{where}': {err['msg']}{got}", where, "invalid_value") from None
    if req.n is not None and req.n != 1:
        raise RequestError(f"'n' must be 1 (one answer per request), got {req.n!r}", "n", "unsupported_parameter")
    for name in ("tools", "functions"):
        if getattr(req, name):
            raise _refuse(name, "the coordinator's members answer in text; tool calling is not available")
    for name in ("tool_choice", "function_call"):
        value = getattr(req, name)
        if value is not None and value != "none":
            raise _refuse(name, f"tool calling is not available (only 'none' is accepted), got {value!r}")
    if req.response_format is not None and req.response_format.get("type") != "text":
        raise _refuse("response_format", "structured outputs (JSON mode, JSON schema) are not available: the answer "
                                         "is a member's free text; only {\"type\": \"text\"} is accepted")
    if req.logprobs or req.top_logprobs is not None:
        which = "logprobs" if req.logprobs else "top_logprobs"
        raise _refuse(which, "token log-probabilities are not returned (an answer may come from any member, or "
                             "from the store)")
    if req.modalities is not None and set(req.modalities) - {"text"}:
        raise _refuse("modalities", f"text only, got {req.modalities!r}")
    if req.audio is not None:
        raise _refuse("audio", "text only")
    if req.answer_format is not None and req.model != coordinator_model:
        raise RequestError(f"'answer_format' applies to model {coordinator_model!r} only", "answer_format",
                           "unsupported_parameter")
    caps = [c for c in (req.max_tokens, req.max_completion_tokens) if c is not None]
    ignored = tuple(sorted(k for k, v in (req.model_extra or {}).items() if v is not None))
    return ChatRequest(model=req.model, messages=req.messages, stream=bool(req.stream),
                       include_usage=bool(req.stream_options and req.stream_options.include_usage),
                       answer_format=req.answer_format or "free", max_tokens=min(caps) if caps else None,
                       ignored=ignored)
