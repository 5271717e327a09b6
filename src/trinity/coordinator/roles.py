"""The three roles: prompts a pool model sees, and how its reply is read.

Worker   answers the query; sees earlier Worker answers as reference thoughts and the Thinker's suggestion.
Thinker  reads query + earlier thoughts + current answer; replies with <suggestion> and <suggested_role>
         (the suggested role overrides the head's next role pick).
Verifier reads query + current answer; replies ACCEPT or REJECT (start of reply first, then keywords;
         default REJECT).
"""
from __future__ import annotations

import re
from dataclasses import dataclass
from enum import Enum

from trinity.records import ChatMessage, Task


class Role(str, Enum):
    THINKER = "thinker"
    WORKER = "worker"
    VERIFIER = "verifier"


ROLES: tuple[Role, ...] = (Role.THINKER, Role.WORKER, Role.VERIFIER)
"""Order of the head's last three logits."""


@dataclass(frozen=True)
class Turn:
    """One step of an episode: which model acted, in which role, and what it said."""

    model: str
    role: Role
    text: str
    ok: bool = True
    suggestion: str | None = None
    suggested_role: Role | None = None
    verdict: str | None = None  # "ACCEPT" / "REJECT" for Verifier turns


DISPATCHER_PROMPT = (
    "You are a dispatcher. You read a conversation between a user and a team of AI models and decide "
    "which model should act next and in which role: thinker (plans and critiques), worker (solves), "
    "or verifier (checks the current answer)."
)

ANSWER_FORMAT = {
    "math": "Solve it concisely in a few short steps, then put the final answer in \\boxed{}.",
    "choice": "Reason briefly, then finish with a line of the form 'Answer: X' where X is the option letter.",
    "code": "Write a complete, self-contained Python solution in one ```python code block.",
    "judge": "",
}


def coordinator_text(task: Task, turns: tuple[Turn, ...]) -> str:
    """What the coordinator LM reads: plain 'role: content' lines under the dispatcher prompt."""
    parts = [f"system: {DISPATCHER_PROMPT}", f"user: {task.query}"]
    parts += [f"{t.role.value}: {t.text}" for t in turns]
    return "\n\n".join(parts)


def latest_answer(turns: tuple[Turn, ...]) -> str | None:
    for t in reversed(turns):
        if t.role is Role.WORKER and t.ok:
            return t.text
    return None


def _pending_suggestion(turns: tuple[Turn, ...]) -> str | None:
    """The latest Thinker suggestion not yet followed by a Worker answer."""
    for t in reversed(turns):
        if t.role is Role.WORKER:
            return None
        if t.role is Role.THINKER and t.suggestion:
            return t.suggestion
    return None


def role_messages(role: Role, task: Task, turns: tuple[Turn, ...]) -> list[ChatMessage]:
    """The chat a pool model sees when it acts in `role` after `turns`."""
    fmt = ANSWER_FORMAT.get(task.grader, "")
    answer = latest_answer(turns)
    if role is Role.WORKER:
        body = task.query
        refs = [t.text for t in turns if t.role is Role.WORKER and t.ok]
        if refs:
            body += "\n\nReference thoughts from other solvers (they may contain mistakes):\n" + "\n---\n".join(
                _clip(r) for r in refs[-2:])
        sugg = _pending_suggestion(turns)
        if sugg:
            body += f"\n\nA reviewer suggests: {sugg}"
        if fmt:
            body += f"\n\n{fmt}"
        return [ChatMessage("system", "You are a careful expert problem solver."), ChatMessage("user", body)]
    if role is Role.THINKER:
        thoughts = [f"{t.role.value}: {_clip(t.text)}" for t in turns if t.ok and t.role is not Role.WORKER]
        body = f"Question:\n{task.query}\n\n"
        if thoughts:
            body += "Earlier thoughts:\n" + "\n".join(thoughts[-3:]) + "\n\n"
        body += f"Current answer:\n{_clip(answer) if answer else '(none yet)'}\n\n"
        body += ("Think about how to solve the question or fix the current answer. Reply with a short plan in "
                 "<suggestion>...</suggestion>, then the role that should act next in "
                 "<suggested_role>worker</suggested_role> or <suggested_role>verifier</suggested_role>.")
        return [ChatMessage("system", "You are a strategic thinker who guides a team of solvers."),
                ChatMessage("user", body)]
    if role is Role.VERIFIER:
        body = (f"Question:\n{task.query}\n\nProposed answer:\n{_clip(answer or '')}\n\n"
                "Is the proposed answer correct? Reply with ACCEPT or REJECT first, then one sentence why.")
        return [ChatMessage("system", "You are a strict verifier."), ChatMessage("user", body)]
    raise ValueError(f"unknown role {role!r}")


def _clip(text: str, limit: int = 1500) -> str:
    return text if len(text) <= limit else text[:limit] + " …"


_SUGG_RE = re.compile(r"<suggestion>(.*?)(?:</suggestion>|$)", re.S | re.I)
_ROLE_RE = re.compile(r"<suggested_role>\s*(thinker|worker|verifier)\s*(?:</suggested_role>)?", re.I)


def parse_thinker(text: str) -> tuple[str | None, Role | None]:
    m = _SUGG_RE.search(text)
    suggestion = m.group(1).strip() if m and m.group(1).strip() else (text.strip()[:500] or None)
    r = _ROLE_RE.search(text)
    return suggestion, (Role(r.group(1).lower()) if r else None)


def parse_verdict(text: str) -> str:
    """ACCEPT or REJECT: the start of the reply decides; then keywords; default REJECT."""
    head = text.strip().lstrip("*#>`\"' ").upper()
    if head.startswith("ACCEPT"):
        return "ACCEPT"
    if head.startswith("REJECT"):
        return "REJECT"
    up = text.upper()
    has_a, has_r = "ACCEPT" in up, "REJECT" in up
    if has_a and not has_r:
        return "ACCEPT"
    return "REJECT"


def make_turn(model: str, role: Role, text: str, ok: bool) -> Turn:
    if not ok:
        return Turn(model=model, role=role, text=text, ok=False)
    if role is Role.THINKER:
        s, r = parse_thinker(text)
        return Turn(model=model, role=role, text=text, suggestion=s, suggested_role=r)
    if role is Role.VERIFIER:
        return Turn(model=model, role=role, text=text, verdict=parse_verdict(text))
    return Turn(model=model, role=role, text=text)
