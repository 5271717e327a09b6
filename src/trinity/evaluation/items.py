"""The records of an evaluation run: the method ids, one method's result on one item (`ItemResult`: its score,
what it did, its line in data/eval/episodes.jsonl) and the run (`EvalRun`: every item and the calls each method
made). `trinity.evaluation.run` plays the methods and fills them; `trinity.evaluation.summary` scores them."""
from __future__ import annotations

from dataclasses import dataclass, field

from trinity.coordinator.roles import Turn
from trinity.records import Task

COORDINATOR = "trinity"
RANDOM_ROUTING = "random-routing"
ORACLE = "oracle:best-single"

OUTAGE_MARK = "outage: "
"""How an item's `error` starts when an outage left it unscored (`ItemResult.unscored_by_outage`)."""


@dataclass
class ItemResult:
    """One method on one item: its score (None = unscored, see `error`) and everything it did."""

    method: str
    task: Task
    split: str
    score: float | None
    answer: str | None
    turns: list[tuple[int, Turn]]
    """(conversation turn, pool turn) in order."""
    path: list[list[str]]
    verifier_first: bool = False
    judge: list[dict] = field(default_factory=list)
    error: str | None = None
    cost_usd: float = 0.0

    @property
    def tokens(self) -> int:
        return sum(t.prompt_tokens + t.completion_tokens for _, t in self.turns)

    @property
    def latency_s(self) -> float:
        return sum(t.latency_s for _, t in self.turns)

    @property
    def unscored_by_outage(self) -> bool:
        """Whether a call of this item failed transiently (an outage), leaving it unscored: a rerun asks it again."""
        return (self.error or "").startswith(OUTAGE_MARK)

    @property
    def judged(self) -> bool:
        return self.task.grader == "judge"

    def unit_scores(self) -> dict[int, float | None]:
        """The item's scoring units, {conversation turn: score, None = unscored}. A judged conversation (MT-Bench)
        has one per turn, its judgement (None: the judge failed or gave no rating, or the item hit an outage);
        any other item is one unit, {1: its score}."""
        if not self.judged:
            return {1: self.score}
        rated = {j["turn"]: j["score"] for j in self.judge}
        return {k: rated.get(k) for k in range(1, _conversation_turns(self.task) + 1)}

    def row(self) -> dict:
        """The item's line in data/eval/episodes.jsonl (docs/eval_results_schema.md)."""
        return {
            "method": self.method, "benchmark": self.task.source, "split": self.split, "task_id": self.task.id,
            "score": self.score, "answer": self.answer, "verifier_first": self.verifier_first,
            "turns": [{"conversation_turn": k, "model": t.model, "role": t.role.value, "text": t.text, "ok": t.ok,
                       "verdict": t.verdict, "prompt_tokens": t.prompt_tokens,
                       "completion_tokens": t.completion_tokens, "latency_s": round(t.latency_s, 3)}
                      for k, t in self.turns],
            "judge": self.judge, "tokens": self.tokens, "latency_s": round(self.latency_s, 3),
            "cost_usd": self.cost_usd, "path": self.path, "error": self.error,
        }


@dataclass
class EvalRun:
    items: list[ItemResult]
    calls: dict[tuple[str, str], dict]
    """(method, benchmark) → new calls and failed calls while that method ran on that benchmark."""
    wall_s: float


def _conversation_turns(task: Task) -> int:
    """How many user turns a method answers: every prompt of a judged conversation (MT-Bench), else one."""
    return len(task.prompt) if task.grader == "judge" else 1
