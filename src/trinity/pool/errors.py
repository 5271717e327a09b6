"""What can be wrong with a pool before any work starts, and the check that says so.

Model-side failures during a run (timeouts, HTTP errors, malformed replies) are *not* exceptions: a
`ChatModel.chat` call returns a ChatResponse with ok=False. The errors here are configuration errors:
they stop a run at startup with a message naming the pool member and what to fix.
"""
from __future__ import annotations

import os
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from trinity.config import PoolMember, PoolSettings

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


def member_problems(member: "PoolMember") -> list[str]:
    """Everything wrong with one member that can be seen without network access or loading weights."""
    problems: list[str] = []
    if member.backend not in BACKENDS:
        problems.append(f"pool member {member.name!r}: unknown backend {member.backend!r}; "
                        f"known backends: {', '.join(BACKENDS)}")
        return problems
    if member.max_concurrency < 1:
        problems.append(f"pool member {member.name!r}: max_concurrency must be >= 1, got {member.max_concurrency}")
    if member.max_retries < 0:
        problems.append(f"pool member {member.name!r}: max_retries must be >= 0, got {member.max_retries}")
    if member.timeout_s <= 0:
        problems.append(f"pool member {member.name!r}: timeout_s must be > 0, got {member.timeout_s}")
    if member.backend == "openai":
        if not member.base_url:
            problems.append(f"pool member {member.name!r}: backend 'openai' needs base_url")
        elif not member.base_url.startswith(("http://", "https://")):
            problems.append(f"pool member {member.name!r}: base_url must start with http:// or https://, "
                            f"got {member.base_url.split('://')[0]!r}://...")
        try:
            api_key_from_env(member)
        except MissingApiKeyError as e:
            problems.append(str(e))
    else:  # local: a bundled id or an existing .gguf file (cheap check: no assembly, no loading)
        from trinity.pool.bundled import BUNDLED

        p = Path(member.model).expanduser()
        if member.model not in BUNDLED and not (p.suffix == ".gguf" and p.exists()):
            problems.append(f"pool member {member.name!r}: local model {member.model!r} is neither a bundled "
                            f"model ({', '.join(sorted(BUNDLED))}) nor an existing .gguf file")
        if member.engine == "llama-server":
            from trinity.pool.llama_server import binary_problem

            problem = binary_problem()
            if problem is not None:
                problems.append(f"pool member {member.name!r}: {problem}")
        else:
            from trinity.pool.local import binding_problem

            problem = binding_problem()
            if problem is not None:
                problems.append(f"pool member {member.name!r}: {problem}")
    return problems


def check_pool_config(pool: "PoolSettings") -> None:
    """Fail before any work if the pool cannot be built; one message listing every problem.

    Also registers every member's api_key_env with `trinity.redact`, so later `redact()` calls
    (W&B, reports, store rows) scrub those keys."""
    from trinity.redact import register_pool

    register_pool(pool)
    problems = [p for m in pool.members for p in member_problems(m)]
    if pool.max_concurrency < 1:
        problems.append(f"pool.max_concurrency must be >= 1, got {pool.max_concurrency}")
    if problems:
        raise PoolConfigError("pool configuration is invalid:\n" + "\n".join(f"  - {p}" for p in problems))


__all__ = ["BACKENDS", "MissingApiKeyError", "PoolConfigError", "api_key_from_env", "check_pool_config",
           "member_problems"]
