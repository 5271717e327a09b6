"""The kinds of pool member, in one table: which class serves a member's settings (`PoolMember.backend` and, for a
local model, `engine`), whether its calls go over HTTP, and what this machine must have to run it. `build_member`
builds one for the pool (`runtime.build_members`) and for a task runner's worker process (`worker.ProcessMembers`);
`check_pool_config` checks a whole pool before any work (every problem in one message).

| kind | class | calls | needs |
|---|---|---|---|
| openai | `openai_compat.OpenAICompatibleChatModel` | HTTP, to base_url | its API key (api_key_env) |
| local, engine llama-server (default) | `llama_server.LlamaServerChatModel` | HTTP, to its own llama-server | the built server (`make setup`) |
| local, engine in-process | `local.LocalChatModel` | in this process | the binding (`make setup-in-process`) |

The two kinds over HTTP hold the same client (`openai_client.EndpointClient`: retries, limits, failure kinds); the
two local kinds hold the same model (`local.GGUFModel`: the file, its identity, prompts and grammar).
"""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Callable

from trinity.pool.errors import BACKENDS, MissingApiKeyError, PoolConfigError, api_key_from_env

if TYPE_CHECKING:
    from trinity.config import PoolMember, PoolSettings
    from trinity.pool.base import ChatModel, LoopLocalSemaphore


def _no_problem() -> str | None:
    return None


def _server_problem() -> str | None:
    from trinity.pool.llama_server import binary_problem

    return binary_problem()


def _binding_problem() -> str | None:
    from trinity.pool.local import binding_problem

    return binding_problem()


# The classes, imported when a kind is used (a kind's heavy imports are paid only by pools that have one), by
# import statements rather than by name: `trinity.code_version` follows imports, and a member's class shapes results.
def _openai_class() -> type:
    from trinity.pool.openai_compat import OpenAICompatibleChatModel

    return OpenAICompatibleChatModel


def _llama_server_class() -> type:
    from trinity.pool.llama_server import LlamaServerChatModel

    return LlamaServerChatModel


def _in_process_class() -> type:
    from trinity.pool.local import LocalChatModel

    return LocalChatModel


@dataclass(frozen=True)
class MemberKind:
    name: str
    load: Callable[[], type]
    """The class of this kind's members (imported now)."""
    over_http: bool
    """HTTP members share the pool's concurrency limits (global and per member); in-process ones run on the caller's
    thread."""
    engine_problem: Callable[[], str | None]
    """What this machine lacks to run a member of this kind (None: nothing)."""


MEMBER_KINDS = {
    ("openai", None): MemberKind("openai", _openai_class, True, _no_problem),
    ("local", "llama-server"): MemberKind("local/llama-server", _llama_server_class, True, _server_problem),
    ("local", "in-process"): MemberKind("local/in-process", _in_process_class, False, _binding_problem),
}


def kind_of(member: "PoolMember") -> MemberKind:
    """The kind of `member` (a PoolConfigError for an unknown backend: config validation already restricts it)."""
    kind = MEMBER_KINDS.get((member.backend, member.engine if member.backend == "local" else None))
    if kind is None:
        raise PoolConfigError(f"pool member {member.name!r}: unknown backend {member.backend!r}")
    return kind


def over_http(member: "PoolMember") -> bool:
    """Whether the member's calls go over HTTP (OpenAI-compatible endpoint, or llama-server for a local model)."""
    return kind_of(member).over_http


def build_member(member: "PoolMember", global_limit: "LoopLocalSemaphore | None" = None,
                 member_limit: "LoopLocalSemaphore | None" = None) -> "ChatModel":
    """The member of `member`'s settings; an HTTP member under the given limits (None: its own)."""
    kind = kind_of(member)
    if kind.over_http:
        return kind.load()(member, global_limit, member_limit=member_limit)
    return kind.load()(member)


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
    problem = kind_of(member).engine_problem()  # what this machine lacks to run the member's kind
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
