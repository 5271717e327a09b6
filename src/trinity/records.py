"""Plain records shared by every layer: tasks, chat messages, responses.

Frozen dataclasses: they are hashed into store keys and must not change under our feet.
"""
from __future__ import annotations

import hashlib
import json
from dataclasses import asdict, dataclass, field
from typing import Any, Literal

GraderKind = Literal["math", "choice", "code", "judge"]


@dataclass(frozen=True)
class Task:
    """One benchmark item, whatever its source.

    `prompt` holds the user turns (one for most benchmarks, two for MT-Bench).
    `answer` is the reference answer for math/choice graders (a letter for multiple choice);
    `tests` holds test code or a JSON list of test cases for code graders.
    """

    id: str  # globally unique, "<source>/<native id>"
    source: str  # benchmark name, e.g. "math500", "mmlu", "gsm8k", "aime"
    prompt: tuple[str, ...]
    grader: GraderKind
    answer: str | None = None
    tests: str | None = None
    metadata: dict[str, Any] = field(default_factory=dict, hash=False, compare=False)

    @property
    def query(self) -> str:
        """The first user turn: what the coordinator and the pool are asked."""
        return self.prompt[0]

    def to_json(self) -> dict[str, Any]:
        d = asdict(self)
        d["prompt"] = list(self.prompt)
        return d

    @staticmethod
    def from_json(d: dict[str, Any]) -> "Task":
        return Task(
            id=d["id"],
            source=d["source"],
            prompt=tuple(d["prompt"]),
            grader=d["grader"],
            answer=d.get("answer"),
            tests=d.get("tests"),
            metadata=dict(d.get("metadata") or {}),
        )


@dataclass(frozen=True)
class ChatMessage:
    role: Literal["system", "user", "assistant"]
    content: str


@dataclass(frozen=True)
class SamplingParams:
    temperature: float = 0.7
    top_p: float = 0.95
    max_tokens: int = 256
    seed: int = 0


@dataclass(frozen=True)
class ChatResponse:
    """What one call to a pool model produced. A failed call has ok=False and a reason."""

    text: str
    ok: bool = True
    error: str | None = None
    prompt_tokens: int = 0
    completion_tokens: int = 0
    cost_usd: float = 0.0
    latency_s: float = 0.0
    model: str = ""


def stable_hash(obj: Any) -> str:
    """sha256 of a canonical JSON rendering; the content key of every store row."""
    blob = json.dumps(obj, sort_keys=True, ensure_ascii=False, separators=(",", ":"), default=_default)
    return hashlib.sha256(blob.encode("utf-8")).hexdigest()


def _default(o: Any) -> Any:
    if hasattr(o, "__dataclass_fields__"):
        return asdict(o)
    raise TypeError(f"cannot hash {type(o).__name__}")
