"""What an OpenAI-compatible endpoint is sent and what it answers, read without the client
(`trinity.pool.openai_client` holds the client, with its retries): the structured-output `response_format` of an
output format, and the readers of replies and failures (token usage, an error's message and code, Retry-After, a
timeout's root cause, a failure's cause chain, bounded excerpts).
"""
from __future__ import annotations

import contextlib
import email.utils
import json
import time
from typing import Any, Mapping

import openai

from trinity.records import SamplingParams
from trinity.verdict import VERDICT_FORMAT, VERDICT_RESPONSE_FORMAT

_ERROR_EXCERPT_CHARS = 300


def output_response_format(sampling: SamplingParams) -> dict[str, Any] | None:
    """The `response_format` that enforces `sampling.output_format` (None: free text)."""
    if sampling.output_format is None:
        return None
    if sampling.output_format == VERDICT_FORMAT:
        return VERDICT_RESPONSE_FORMAT
    raise ValueError(f"API members have no response_format for output_format {sampling.output_format!r}")


def parse_retry_after(headers: Mapping[str, str], *, now: float | None = None) -> float | None:
    """Seconds to wait from `retry-after-ms`, or `Retry-After` as seconds or an HTTP date; None if absent
    or unparseable. Negative values (a date in the past) become 0."""
    ms = headers.get("retry-after-ms")
    if ms:
        with contextlib.suppress(ValueError):
            return max(0.0, float(ms) / 1000.0)
    value = headers.get("retry-after")
    if not value:
        return None
    value = value.strip()
    try:
        return max(0.0, float(value))
    except ValueError:
        pass
    try:
        when = email.utils.parsedate_to_datetime(value)
    except (TypeError, ValueError, IndexError):
        return None
    if when is None:
        return None
    return max(0.0, when.timestamp() - (time.time() if now is None else now))


def _usage(usage: Any) -> tuple[int, int]:
    if not isinstance(usage, dict):
        return 0, 0

    def num(key: str) -> int:
        v = usage.get(key)
        return int(v) if isinstance(v, (int, float)) and not isinstance(v, bool) and v >= 0 else 0

    return num("prompt_tokens"), num("completion_tokens")


def _error_message(e: openai.APIStatusError) -> str:
    body = e.body
    if isinstance(body, dict):
        inner = body.get("error", body)
        if isinstance(inner, dict) and inner.get("message"):
            return _excerpt(inner["message"])
        return _excerpt(inner)
    if body:
        return _excerpt(body)
    try:
        return _excerpt(e.response.text)
    except Exception:  # noqa: BLE001 - a body we cannot read is no reason to fail harder
        return ""


def _error_code(e: openai.APIStatusError) -> str | None:
    body = e.body
    if isinstance(body, dict):
        inner = body.get("error", body)
        if isinstance(inner, dict):
            return inner.get("code") or inner.get("type")
    return None


def _is_real_timeout(e: BaseException) -> bool:
    """True if the root cause of an SDK timeout error is a timeout, not a mapped connection failure."""
    root: BaseException = e
    seen = 0
    while (root.__cause__ or root.__context__) is not None and seen < 10:
        root = root.__cause__ or root.__context__  # type: ignore[assignment]
        seen += 1
    return isinstance(root, TimeoutError) or "Timeout" in type(root).__name__


def _cause_chain(e: BaseException) -> str:
    """'APIConnectionError: Connection error. <- RemoteProtocolError: peer closed ...' (bounded)."""
    parts = []
    cur: BaseException | None = e
    while cur is not None and len(parts) < 4:
        msg = str(cur)
        part = f"{type(cur).__name__}: {msg}" if msg else type(cur).__name__
        if not parts or parts[-1] != part:
            parts.append(part)
        cur = cur.__cause__ or cur.__context__
    return _excerpt(" <- ".join(parts))


def _excerpt(obj: Any) -> str:
    s = obj if isinstance(obj, str) else json.dumps(obj, default=str)
    s = " ".join(s.split())
    return s if len(s) <= _ERROR_EXCERPT_CHARS else s[:_ERROR_EXCERPT_CHARS] + "..."


__all__ = ["output_response_format", "parse_retry_after"]
