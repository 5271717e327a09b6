"""What can be wrong with a pool before any work starts (the check that says so: `members.check_pool_config`).

Model-side failures during a run (timeouts, HTTP errors, malformed replies) are *not* exceptions: a
`ChatModel.chat` call returns a ChatResponse with ok=False. The errors here are configuration errors:
they stop a run at startup with a message naming the pool member and what to fix.
"""
from __future__ import annotations

import os
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from trinity.config import PoolMember

BACKENDS = ("local", "openai")
"""Backends a pool member may name; keep in sync with `PoolMember.backend`."""


class PoolConfigError(ValueError):
    """A pool member cannot be built as configured (unknown backend, missing key env var, ...)."""


class MissingApiKeyError(PoolConfigError):
    """The env var named by a member's `api_key_env` is unset or empty. The message names the member
    and the variable, never a value."""

    def __init__(self, member: str, env_var: str, *, empty: bool = False) -> None:
        self.member = member
        self.env_var = env_var
        state = "is set but empty" if empty else "is not set"
        super().__init__(
            f"pool member {member!r}: environment variable {env_var!r} (its api_key_env) {state}; "
            f"export it with the endpoint's API key, or drop api_key_env for endpoints that need no key")


def api_key_from_env(member: "PoolMember") -> str | None:
    """The member's API key from the environment; None when the member names no api_key_env.

    Raises MissingApiKeyError (naming member and variable) when the variable is unset or empty."""
    name = member.api_key_env
    if not name:
        return None
    value = os.environ.get(name)
    if value is None or not value.strip():
        raise MissingApiKeyError(member.name, name, empty=value is not None)
    return value.strip()


__all__ = ["BACKENDS", "MissingApiKeyError", "PoolConfigError", "api_key_from_env"]
