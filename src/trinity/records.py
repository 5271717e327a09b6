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
    `history` is the conversation before `query`, as (user, assistant) pairs: empty for a one-turn task; MT-Bench's
    second turn is asked as a task whose history holds the first question and the answer given to it.
    """

    id: str  # globally unique, "<source>/<native id>"
    source: str  # benchmark name, e.g. "math500", "mmlu", "gsm8k", "aime"
    prompt: tuple[str, ...]
    grader: GraderKind
    answer: str | None = None
    tests: str | None = None
    metadata: dict[str, Any] = field(default_factory=dict, hash=False, compare=False)
    history: tuple[tuple[str, str], ...] = ()

    @property
    def query(self) -> str:
        """The first user turn: what the coordinator and the pool are asked."""
        return self.prompt[0]

    def follow_up(self, turn: int, answers: tuple[str, ...]) -> "Task":
        """The task of conversation turn `turn` (1-based) of a multi-turn task: its question `prompt[turn-1]`,
        asked after the earlier questions and `answers` (the answers given to them, in order)."""
        if not 1 <= turn <= len(self.prompt) or len(answers) != turn - 1:
            raise ValueError(f"task {self.id}: turn {turn} needs {turn - 1} earlier answers, got {len(answers)}")
        if turn == 1:
            return Task(id=self.id, source=self.source, prompt=(self.prompt[0],), grader=self.grader,
                        answer=self.answer, tests=self.tests, metadata=self.metadata)
        return Task(id=f"{self.id}#turn{turn}", source=self.source, prompt=(self.prompt[turn - 1],),
                    grader=self.grader, answer=self.answer, tests=self.tests, metadata=self.metadata,
                    history=tuple(zip(self.prompt[:turn - 1], answers)))

    def to_json(self) -> dict[str, Any]:
        d = asdict(self)
        d["prompt"] = list(self.prompt)
        if self.history:
            d["history"] = [list(h) for h in self.history]
        else:
            del d["history"]  # one-turn tasks keep the record shape they always had
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
            history=tuple((str(u), str(a)) for u, a in d.get("history") or ()),
        )


@dataclass(frozen=True)
class ChatMessage:
    role: Literal["system", "user", "assistant"]
    content: str


OUTPUT_FORMATS: tuple[str, ...] = ("verdict",)
"""Reply shapes a request may demand (`SamplingParams.output_format`), each enforced where the backend can:
"verdict" = the Verifier's reply, a short reason then a last line `Verdict: ACCEPT` or `Verdict: REJECT`
(a llama.cpp grammar for local members, `response_format` JSON {"reason", "verdict"} for API members)."""


@dataclass(frozen=True)
class SamplingParams:
    temperature: float = 0.7
    top_p: float = 0.95
    max_tokens: int = 256
    seed: int = 0
    output_format: str | None = None
    """None: free text. "verdict": see OUTPUT_FORMATS. Left out of the store key while None, so the keys of
    unconstrained requests are what they were before the field existed."""

    def __post_init__(self) -> None:
        if self.output_format is not None and self.output_format not in OUTPUT_FORMATS:
            raise ValueError(f"unknown output_format {self.output_format!r}; expected one of {OUTPUT_FORMATS}")

    def key_fields(self) -> dict[str, Any]:
        """What of these settings goes into a store key (`stable_hash`): every field, bar a None output_format."""
        d = asdict(self)
        if d["output_format"] is None:
            del d["output_format"]
        return d


FailureKind = Literal["transient", "deterministic"]
FAILURE_KINDS: tuple[str, ...] = ("transient", "deterministic")


@dataclass(frozen=True)
class ChatResponse:
    """What one call to a pool model produced. A failed call has ok=False, a reason and a `failure` kind:

    - "transient": an outage (429, 5xx, timeout, dropped connection, truncated body, exhausted quota, auth):
      it says nothing about the question, so it is *not* a sample. It is counted and logged, never served
      from the store: the next run asks again.
    - "deterministic": the request itself fails (too long for the context, invalid, content filter, an
      empty reply the model really produced): asking again gives the same, so it is stored as the answer.
    """

    text: str
    ok: bool = True
    error: str | None = None
    prompt_tokens: int = 0
    completion_tokens: int = 0
    cost_usd: float = 0.0
    latency_s: float = 0.0
    model: str = ""
    failure: FailureKind | None = None

    def __post_init__(self) -> None:
        if not self.ok and self.failure is None:  # a failure of unknown kind is retried, never kept
            object.__setattr__(self, "failure", "transient")
        if self.ok and self.failure is not None:
            raise ValueError(f"an ok response cannot carry failure={self.failure!r}")
        if self.failure is not None and self.failure not in FAILURE_KINDS:
            raise ValueError(f"unknown failure kind {self.failure!r}; expected one of {FAILURE_KINDS}")

    @property
    def is_sample(self) -> bool:
        """True when this response is the model's answer to its request (ok, or a deterministic failure),
        so it may be stored and served for that request; False for an outage."""
        return self.ok or self.failure == "deterministic"


def stable_hash(obj: Any) -> str:
    """sha256 of a canonical JSON rendering; the content key of every store row."""
    blob = json.dumps(obj, sort_keys=True, ensure_ascii=False, separators=(",", ":"), default=_default)
    return hashlib.sha256(blob.encode("utf-8")).hexdigest()


def _default(o: Any) -> Any:
    if hasattr(o, "key_fields"):  # a record that says what of it shapes a key (SamplingParams)
        return o.key_fields()
    if hasattr(o, "__dataclass_fields__"):
        return asdict(o)
    raise TypeError(f"cannot hash {type(o).__name__}")
