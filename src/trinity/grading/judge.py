"""MT-Bench grading by an LLM judge, with FastChat's own judge prompts (single-v1, single-math-v1 with a
reference answer, and their multi-turn variants), read from the benchmark directory.

The judge is a member of a `Pool` (an API model through the OpenAI-compatible backend, or a local one), so
every judge call goes through the response store like any other call: a rerun pays nothing. `judge_pool`
builds the judge's own one-member pool at FastChat's temperature 0. The score is parsed from "[[x]]"
(FastChat's pattern, then its "[x]" fallback). A judge that fails or gives no parseable rating is recorded
as a failure with its reason — never guessed.
"""
from __future__ import annotations

import json
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Sequence

from trinity.config import PoolMember, PoolSettings
from trinity.records import ChatMessage, Task

NEED_REF_CATEGORIES = frozenset({"math", "reasoning", "coding"})
_SCORE = re.compile(r"\[\[(\d+\.?\d*)\]\]")
_SCORE_BACKUP = re.compile(r"\[(\d+\.?\d*)\]")


class JudgeError(ValueError):
    pass


@dataclass(frozen=True)
class JudgePrompt:
    name: str
    system_prompt: str
    prompt_template: str


@dataclass(frozen=True)
class JudgeVerdict:
    task_id: str
    turn: int
    prompt_name: str
    score: float | None
    """1-10, or None when the judge failed (see error)."""
    raw: str
    error: str | None = None

    @property
    def ok(self) -> bool:
        return self.score is not None


def load_judge_prompts(root: str | Path) -> dict[str, JudgePrompt]:
    path = Path(root) / "mt_bench" / "lm-sys_FastChat" / "judge_prompts.jsonl"
    if not path.exists():
        raise JudgeError(f"{path}: judge prompts file not found")
    prompts = {}
    for n, line in enumerate(path.read_text().splitlines(), 1):
        if not line.strip():
            continue
        try:
            d = json.loads(line)
            prompts[d["name"]] = JudgePrompt(d["name"], d["system_prompt"], d["prompt_template"])
        except (json.JSONDecodeError, KeyError) as e:
            raise JudgeError(f"{path}: line {n}: malformed judge prompt ({e})") from None
    for need in ("single-v1", "single-math-v1", "single-v1-multi-turn", "single-math-v1-multi-turn"):
        if need not in prompts:
            raise JudgeError(f"{path}: judge prompt {need!r} missing")
    return prompts


def parse_score(text: str) -> float | None:
    m = _SCORE.search(text) or _SCORE_BACKUP.search(text)
    if not m:
        return None
    score = float(m.group(1))
    return score if 0 <= score <= 10 else None


JUDGE_ROLE = "judge"
"""The label judge calls are stored under (the store's role column, exports); they ask the judge member's own
sampling (no cap, free text)."""


def judge_member(member: PoolMember, max_tokens: int) -> PoolMember:
    """A member's settings as a judge: FastChat's temperature 0 (greedy), `max_tokens` for the reply."""
    return member.model_copy(update={"temperature": 0.0, "top_p": 1.0, "max_tokens": max_tokens})


def judge_pool(member: PoolMember, max_tokens: int, store, max_concurrency: int = 8):
    """The judge's own one-member pool (sharing the response store, and a local model already loaded by the main
    pool: llama.cpp models are loaded once per process)."""
    from trinity.pool.runtime import build_pool

    return build_pool(PoolSettings(members=[judge_member(member, max_tokens)], max_concurrency=max_concurrency),
                      store)


class MTBenchJudge:
    """FastChat's single-answer grading by member `idx` of `pool` (see `judge_pool`)."""

    def __init__(self, pool, prompts: dict[str, JudgePrompt], idx: int = 0):
        self.pool = pool
        self.idx = idx
        self.prompts = prompts
        self.verdicts = self.unparseable = self.failed = 0

    def stats(self) -> dict:
        """Judgements made by this judge so far: rated, without a parseable rating, failed calls; and its calls."""
        return {"verdicts": self.verdicts, "unparseable": self.unparseable, "failed": self.failed,
                "calls_new": self.pool.stats.calls_made, "store_hits": self.pool.stats.store_hits}

    def messages(self, task: Task, answers: Sequence[str], turn: int) -> tuple[str, list[ChatMessage]]:
        """The judge prompt for `turn` (1 or 2) of a judged task (MT-Bench's two turns, or a user benchmark's open
        question of one or two turns) answered with `answers`."""
        if task.grader != "judge" or len(task.prompt) not in (1, 2):
            raise JudgeError(f"{task.id}: not a judged task of one or two turns")
        if turn not in range(1, len(task.prompt) + 1) or len(answers) < turn:
            raise JudgeError(f"{task.id}: turn {turn} needs {turn} answer(s), got {len(answers)}")
        needs_ref = task.metadata.get("category") in NEED_REF_CATEGORIES
        ref = task.metadata.get("reference") or []
        if needs_ref and len(ref) < turn:
            raise JudgeError(f"{task.id}: category {task.metadata.get('category')!r} needs a reference answer")
        name = ("single-math-v1" if needs_ref else "single-v1") + ("-multi-turn" if turn == 2 else "")
        p = self.prompts[name]
        fields = {"question": task.prompt[0], "answer": answers[0], "question_1": task.prompt[0],
                  "question_2": task.prompt[1] if turn == 2 else "", "answer_1": answers[0], "answer_2": answers[1] if turn == 2 else ""}
        if needs_ref:
            fields |= {"ref_answer_1": ref[0], "ref_answer_2": ref[1] if len(ref) > 1 else ""}
        return name, [ChatMessage("system", p.system_prompt), ChatMessage("user", p.prompt_template.format(**fields))]

    async def judge_turn(self, task: Task, answers: Sequence[str], turn: int) -> JudgeVerdict:
        return (await self.judge_turns([(task, answers, turn)]))[0]

    async def judge_turns(self, jobs: Sequence[tuple[Task, Sequence[str], int]]) -> list[JudgeVerdict]:
        """Judge many (task, answers, turn) at once: one batch of pool requests (stored ones cost nothing; a long
        batch of new calls reports its progress)."""
        prompts = [self.messages(task, answers, turn) for task, answers, turn in jobs]
        requests = [self.pool.request(self.idx, msgs, label=JUDGE_ROLE) for _, msgs in prompts]
        replies = await self.pool.complete_many(requests)
        return [self._verdict(task, turn, name, resp) for (task, _, turn), (name, _), resp in zip(jobs, prompts, replies)]

    def _verdict(self, task: Task, turn: int, name: str, resp) -> JudgeVerdict:
        if not resp.ok:
            self.failed += 1
            return JudgeVerdict(task.id, turn, name, None, resp.text, f"judge call failed: {resp.error}")
        score = parse_score(resp.text)
        if score is None:
            self.unparseable += 1
            return JudgeVerdict(task.id, turn, name, None, resp.text, "no [[rating]] in the judge's reply")
        self.verdicts += 1
        return JudgeVerdict(task.id, turn, name, score, resp.text)
