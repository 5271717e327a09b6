"""The three roles: prompts a pool model sees, and how its reply is read.

Worker   answers the query; sees earlier Worker answers as reference thoughts and the Thinker's suggestion.
Thinker  reads query + earlier thoughts + current answer; replies with <suggestion> and <suggested_role>
         (the suggested role overrides the head's next role pick — `forced_role`). While there is no answer
         yet it is asked for a Worker only, and a Verifier it names anyway is ignored (the head's pick stands):
         a Verifier with nothing to verify would end the episode at 0 (measured: 2 of 12 evaluation items).
Verifier reads query + current answer; replies with a short reason, then a last line `Verdict: ACCEPT` or
         `Verdict: REJECT` (`SamplingParams.output_format` "verdict": local members decode under a grammar that
         admits only that shape, API members get it as structured output, a JSON object with a "verdict"
         member). Only that field is read (`parse_verdict`); a reply without it is no verdict (Turn.verdict
         None): the episode goes on, since only ACCEPT ends it. Prose is never read as a verdict: "It is
         impossible to accept this answer." once read as ACCEPT, and a false ACCEPT stops on an unchecked answer.
"""
from __future__ import annotations

import re
from dataclasses import dataclass, field
from enum import Enum

from trinity.records import ChatMessage, Task
from trinity.verdict import parse_verdict


class Role(str, Enum):
    THINKER = "thinker"
    WORKER = "worker"
    VERIFIER = "verifier"


ROLES: tuple[Role, ...] = (Role.THINKER, Role.WORKER, Role.VERIFIER)
"""Order of the head's last three logits."""


def allowed_roles(coordinator) -> tuple[Role, ...]:
    """The roles a coordinator's head may pick (`coordinator.roles` of a `config.CoordinatorSettings`), in the head's
    order: all three for the paper's coordinator, Worker alone for the learned router (`coordinator.router`)."""
    return tuple(r for r in ROLES if r.value in coordinator.roles)


@dataclass(frozen=True)
class Turn:
    """One step of an episode: which model acted, in which role, and what it said."""

    model: str
    role: Role
    text: str
    ok: bool = True
    suggestion: str | None = None
    suggested_role: Role | None = None
    verdict: str | None = None  # a Verifier's verdict field, "ACCEPT" / "REJECT"; None: no field (no verdict)
    # What the call cost, as recorded when it was paid (a stored reply keeps its original figures). Not part of
    # a turn's identity: two calls that said the same thing are the same turn.
    prompt_tokens: int = field(default=0, compare=False)
    completion_tokens: int = field(default=0, compare=False)
    latency_s: float = field(default=0.0, compare=False)
    failure: str | None = field(default=None, compare=False)
    """For a failed call: "transient" (an outage) or "deterministic" (see records.ChatResponse)."""


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

VERIFIER_INSTRUCTION = (
    "Is the proposed answer correct? Reply with at most two short sentences of reasoning, then end with your "
    "verdict, ACCEPT or REJECT, on a last line of the form `Verdict: ACCEPT` or `Verdict: REJECT`.")
"""What a Verifier is asked (after the question and the proposed answer). The example fields sit inside a
sentence, so a model that echoes the prompt back has given no verdict: a field starts its line."""


def coordinator_text(task: Task, turns: tuple[Turn, ...]) -> str:
    """What the coordinator LM reads: plain 'role: content' lines under the dispatcher prompt (earlier turns
    of a multi-turn conversation first, as user / assistant lines)."""
    parts = [f"system: {DISPATCHER_PROMPT}"]
    for user, assistant in task.history:
        parts += [f"user: {user}", f"assistant: {assistant}"]
    parts.append(f"user: {task.query}")
    parts += [f"{t.role.value}: {t.text}" for t in turns]
    return "\n\n".join(parts)


def is_answer(turn: Turn) -> bool:
    """Whether a turn is an answer: a Worker reply that succeeded. A failed call (ok=False: an outage, an
    empty reply) is never an answer, whatever text it carries."""
    return turn.role is Role.WORKER and turn.ok


def latest_answer(turns: tuple[Turn, ...]) -> str | None:
    """*The* answer of a transcript: the latest successful Worker reply (None if there is none). The one
    definition used everywhere: what is graded, exported, printed by `trinity ask`, and shown to later roles."""
    for t in reversed(turns):
        if is_answer(t):
            return t.text
    return None


ANSWER_RULES: tuple[str, ...] = ("latest", "first", "accepted_else_first", "latest_unrejected")
"""Which Worker answer an episode returns (`returned_answer`; `coordinator.answer_rule`). Chosen by regrading
stored episodes every way at no call (scripts/answer_rule.py, reports/evidence/answer_rule.md)."""


def returned_answer(turns: tuple[Turn, ...], rule: str = "latest") -> str | None:
    """The answer an episode returns (what is graded, exported, served), by `rule`:

    latest               the latest successful Worker reply (`latest_answer`: also what later roles are shown);
    first                the first one: a later turn never overwrites it;
    accepted_else_first  the answer a Verifier ACCEPTed (the latest answer when the verdict came), else the first;
    latest_unrejected    the latest answer no Verifier REJECTed, else the latest.
    None when no Worker succeeded.
    """
    answers: list[str] = []
    accepted: str | None = None
    rejected: set[int] = set()
    for t in turns:
        if is_answer(t):
            answers.append(t.text)
        elif t.role is Role.VERIFIER and t.ok and answers:
            if t.verdict == "ACCEPT":
                accepted = answers[-1]
            elif t.verdict == "REJECT":
                rejected.add(len(answers) - 1)
    if not answers:
        return None
    if rule == "latest":
        return answers[-1]
    if rule == "first":
        return answers[0]
    if rule == "accepted_else_first":
        return accepted if accepted is not None else answers[0]
    if rule == "latest_unrejected":
        kept = [a for i, a in enumerate(answers) if i not in rejected]
        return kept[-1] if kept else answers[-1]
    raise ValueError(f"coordinator.answer_rule {rule!r}: expected one of {', '.join(ANSWER_RULES)}")


def forced_role(turn: Turn, answer: str | None) -> Role | None:
    """The role `turn` forces on the next pick: a Thinker's suggested role, except a Verifier while there is no
    answer (`answer`: the latest answer after `turn`) — then nothing is forced and the head's pick stands."""
    if turn.role is not Role.THINKER or turn.suggested_role is None:
        return None
    if turn.suggested_role is Role.VERIFIER and answer is None:
        return None
    return turn.suggested_role


def _pending_suggestion(turns: tuple[Turn, ...]) -> str | None:
    """The latest Thinker suggestion not yet followed by a Worker answer."""
    for t in reversed(turns):
        if t.role is Role.WORKER:
            return None
        if t.role is Role.THINKER and t.suggestion:
            return t.suggestion
    return None


def _earlier_conversation(task: Task) -> str:
    """A multi-turn task's earlier turns, for the roles that see the conversation as one text."""
    if not task.history:
        return ""
    lines = [f"User: {_clip(u)}\nAssistant: {_clip(a)}" for u, a in task.history]
    return "Conversation so far:\n" + "\n\n".join(lines) + "\n\n"


def role_messages(role: Role, task: Task, turns: tuple[Turn, ...]) -> list[ChatMessage]:
    """The chat a pool model sees when it acts in `role` after `turns`. A Worker of a multi-turn task sees the
    earlier conversation as real user / assistant messages; Thinker and Verifier read it before the question."""
    fmt = ANSWER_FORMAT.get(task.grader, "")
    answer = latest_answer(turns)
    earlier = _earlier_conversation(task)
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
        history = [ChatMessage(r, text) for u, a in task.history for r, text in (("user", u), ("assistant", a))]
        return [ChatMessage("system", "You are a careful expert problem solver."), *history, ChatMessage("user", body)]
    if role is Role.THINKER:
        thoughts = [f"{t.role.value}: {_clip(t.text)}" for t in turns if t.ok and t.role is not Role.WORKER]
        body = f"{earlier}Question:\n{task.query}\n\n"
        if thoughts:
            body += "Earlier thoughts:\n" + "\n".join(thoughts[-3:]) + "\n\n"
        body += f"Current answer:\n{_clip(answer) if answer else '(none yet)'}\n\n"
        if answer:
            body += ("Think about how to solve the question or fix the current answer. Reply with a short plan in "
                     "<suggestion>...</suggestion>, then the role that should act next in "
                     "<suggested_role>worker</suggested_role> or <suggested_role>verifier</suggested_role>.")
        else:
            body += ("Think about how to solve the question. Reply with a short plan in <suggestion>...</suggestion>,"
                     " then <suggested_role>worker</suggested_role> (a solver acts next).")
        return [ChatMessage("system", "You are a strategic thinker who guides a team of solvers."),
                ChatMessage("user", body)]
    if role is Role.VERIFIER:
        body = (f"{earlier}Question:\n{task.query}\n\nProposed answer:\n{_clip(answer or '')}\n\n"
                f"{VERIFIER_INSTRUCTION}")
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


def make_turn(model: str, role: Role, text: str, ok: bool, *, prompt_tokens: int = 0, completion_tokens: int = 0,
              latency_s: float = 0.0, failure: str | None = None) -> Turn:
    usage = {"prompt_tokens": prompt_tokens, "completion_tokens": completion_tokens, "latency_s": latency_s}
    if not ok:
        return Turn(model=model, role=role, text=text, ok=False, failure=failure, **usage)
    if role is Role.THINKER:
        s, r = parse_thinker(text)
        return Turn(model=model, role=role, text=text, suggestion=s, suggested_role=r, **usage)
    if role is Role.VERIFIER:
        return Turn(model=model, role=role, text=text, verdict=parse_verdict(text), **usage)
    return Turn(model=model, role=role, text=text, **usage)


def turn_of(model: str, role: Role, resp) -> Turn:
    """The turn a pool reply (`records.ChatResponse`) makes, with its recorded usage."""
    return make_turn(model, role, resp.text, resp.ok, prompt_tokens=resp.prompt_tokens,
                     completion_tokens=resp.completion_tokens, latency_s=resp.latency_s, failure=resp.failure)
