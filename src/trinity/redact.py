"""Secret redaction for everything that leaves the process: W&B logs, reports, store rows, log lines.

`redact(obj)` returns a copy of `obj` in which
  * the *values* of registered secret env vars (every pool member's `api_key_env`, registered by
    `register_pool` / `check_pool_config` / the OpenAI-compatible backend) are replaced by
    `[REDACTED:<ENV_NAME>]`; values are read from the environment at call time, so a key rotated
    after registration is still caught;
  * the values of well-known credential env vars (names ending in _API_KEY, _TOKEN, _SECRET, ...,
    e.g. OPENAI_API_KEY, WANDB_API_KEY, HF_TOKEN) are replaced the same way;
  * anything shaped like a common API key or bearer token (sk-..., sk-ant-..., AIza..., hf_...,
    gsk_..., ghp_..., AKIA..., "Bearer <token>") becomes `[REDACTED]`;
  * dict entries whose *key* names a credential (api_key, authorization, password, secret, token...)
    get their whole value replaced when it is a string.

Strings, mappings, lists/tuples/sets, dataclasses (returned as the same type via `replace`) and
pydantic models (via `model_copy`) are walked recursively; other objects are returned unchanged.
Registered values shorter than 6 characters, and values under 12 characters of env vars that are
only guessed to be credentials by name, are not treated as secrets (they would shred ordinary text).

`RedactingFilter` applies the same to log records; attach it to a handler.
"""
from __future__ import annotations

import dataclasses
import logging
import os
import re
import threading
from collections.abc import Iterable, Mapping
from typing import Any

MIN_SECRET_LEN = 6
_GUESSED_SECRET_MIN_LEN = 12

_lock = threading.Lock()
_secret_env_names: set[str] = set()

# Env var names whose values are credentials whatever the pool says.
_CREDENTIAL_ENV_NAME = re.compile(
    r"(?:^|_)(?:API_?KEY|ACCESS_?KEY|SECRET(?:_ACCESS)?_?KEY|SECRET|TOKEN|PASSWORD|PASSWD|AUTH)$", re.I)

# Common key / token shapes. Order matters only for readability; all are applied.
_KEY_PATTERNS: tuple[re.Pattern[str], ...] = (
    re.compile(r"\bBearer\s+[A-Za-z0-9._~+/=-]{6,}", re.I),
    re.compile(r"\bsk-(?:proj-|ant-|or-|svcacct-|admin-)?[A-Za-z0-9_-]{16,}"),
    re.compile(r"\bAIza[0-9A-Za-z_-]{30,}"),
    re.compile(r"\bhf_[A-Za-z0-9]{20,}"),
    re.compile(r"\bgsk_[A-Za-z0-9]{20,}"),
    re.compile(r"\bxai-[A-Za-z0-9]{20,}"),
    re.compile(r"\b(?:ghp|gho|ghs|ghu|github_pat)_[A-Za-z0-9_]{20,}"),
    re.compile(r"\bAKIA[0-9A-Z]{16}\b"),
    re.compile(r"\bxox[abprs]-[A-Za-z0-9-]{10,}"),
)

# Mapping keys whose values are credentials as a whole (header dicts, request options, configs).
_CREDENTIAL_FIELD = re.compile(
    r"^(?:x-)?(?:api[-_]?key|apikey|authorization|proxy-authorization|password|passwd|secret|"
    r"client[-_]?secret|access[-_]?token|refresh[-_]?token|auth[-_]?token|token|x-api-key|x-goog-api-key)$",
    re.I)

REDACTED = "[REDACTED]"


def register_secret_env_names(names: Iterable[str | None]) -> None:
    """Declare env var names whose values must never be written out (e.g. pool `api_key_env`s)."""
    with _lock:
        _secret_env_names.update(n for n in names if n)


def register_pool(pool: Any) -> None:
    """Register every member's `api_key_env` of a `PoolSettings` (or any object with `.members`)."""
    register_secret_env_names(getattr(m, "api_key_env", None) for m in pool.members)


def registered_secret_env_names() -> frozenset[str]:
    with _lock:
        return frozenset(_secret_env_names)


def _secret_values(extra: Iterable[str] = ()) -> list[tuple[str, str]]:
    """(value, replacement) pairs, longest value first so a key containing another is removed whole."""
    pairs: dict[str, str] = {}
    names = registered_secret_env_names()
    for name, value in os.environ.items():
        if not value:
            continue
        # Registered names are secrets by declaration; names that merely look like credentials need a
        # value that looks like one too (long), so e.g. FOO_TOKEN=default does not shred the word.
        if (name in names and len(value) >= MIN_SECRET_LEN) or (
                _CREDENTIAL_ENV_NAME.search(name) and len(value) >= _GUESSED_SECRET_MIN_LEN):
            pairs.setdefault(value, f"[REDACTED:{name}]")
    for value in extra:
        if value and len(value) >= MIN_SECRET_LEN:
            pairs.setdefault(value, REDACTED)
    return sorted(pairs.items(), key=lambda kv: -len(kv[0]))


def redact_text(text: str, *, extra_secrets: Iterable[str] = ()) -> str:
    """`redact` for one string."""
    return _redact_str(text, _secret_values(extra_secrets))


def _redact_str(text: str, secrets: list[tuple[str, str]]) -> str:
    for value, repl in secrets:
        if value in text:
            text = text.replace(value, repl)
    for pat in _KEY_PATTERNS:
        text = pat.sub(REDACTED, text)
    return text


def redact(obj: Any, *, extra_secrets: Iterable[str] = ()) -> Any:
    """A copy of `obj` with secrets replaced (see the module docstring). Never mutates `obj`."""
    return _walk(obj, _secret_values(extra_secrets), 0)


def _walk(obj: Any, secrets: list[tuple[str, str]], depth: int) -> Any:
    if depth > 50:  # cyclic or absurdly deep: refuse to guess, drop it
        return REDACTED
    if isinstance(obj, str):
        return _redact_str(obj, secrets)
    if isinstance(obj, (bytes, bytearray)):
        text = bytes(obj).decode("utf-8", errors="replace")
        red = _redact_str(text, secrets)
        return obj if red == text else red.encode("utf-8")
    if obj is None or isinstance(obj, (bool, int, float, complex)):
        return obj
    if isinstance(obj, Mapping):
        out = {}
        for k, v in obj.items():
            key = _walk(k, secrets, depth + 1) if isinstance(k, str) else k
            if isinstance(k, str) and _CREDENTIAL_FIELD.match(k) and isinstance(v, (str, bytes)) and v:
                out[key] = REDACTED
            else:
                out[key] = _walk(v, secrets, depth + 1)
        return out
    if isinstance(obj, (list, tuple, set, frozenset)):
        items = [_walk(v, secrets, depth + 1) for v in obj]
        if isinstance(obj, tuple) and hasattr(obj, "_fields"):  # namedtuple
            return type(obj)(*items)
        return type(obj)(items) if not isinstance(obj, list) else items
    if dataclasses.is_dataclass(obj) and not isinstance(obj, type):
        changes = {f.name: _walk(getattr(obj, f.name), secrets, depth + 1)
                   for f in dataclasses.fields(obj) if f.init}
        return dataclasses.replace(obj, **changes)
    model_dump = getattr(obj, "model_dump", None)
    if callable(model_dump) and hasattr(type(obj), "model_fields"):  # pydantic v2 model
        return obj.model_copy(update={name: _walk(getattr(obj, name), secrets, depth + 1)
                                      for name in type(obj).model_fields})
    if isinstance(obj, BaseException):
        return type(obj).__name__ + ": " + _redact_str(str(obj), secrets)
    return obj


class RedactingFilter(logging.Filter):
    """Rewrites a record's message (and exception text) through `redact` before handlers format it."""

    def filter(self, record: logging.LogRecord) -> bool:
        secrets = _secret_values()
        try:
            message = record.getMessage()
        except Exception:  # a broken format string: keep the raw template
            message = str(record.msg)
        record.msg = _redact_str(message, secrets)
        record.args = None
        if record.exc_info:
            formatter = logging.Formatter()
            record.exc_text = _redact_str(formatter.formatException(record.exc_info), secrets)
            record.exc_info = None
        return True


__all__ = [
    "REDACTED", "RedactingFilter", "redact", "redact_text", "register_pool",
    "register_secret_env_names", "registered_secret_env_names",
]
