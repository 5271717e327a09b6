"""The three roles: prompts a pool model sees, and how its reply is read.

Worker   answers the query; sees earlier Worker answers as reference thoughts and the Thinker's suggestion.
Thinker  reads query + earlier thoughts + current answer; replies with <suggestion> and <suggested_role>
         (the suggested role overrides the head's next role pick — `forced_role`). While there is no answer
         yet it is asked for a Worker only, and a Verifier it names anyway is ignored (the head's pick stands):
         a Verifier with nothing to verify would end the episode at 0 (measured: 2 of 12 evaluation items).
Verifier reads query + current answer; replies ACCEPT or REJECT (read as a whole word or a field such as
         "Verdict: accept"; a negated accept such as "cannot accept", "unacceptable" is REJECT; the
         first clear verdict decides; default REJECT).
"""
from __future__ import annotations

import re
from dataclasses import dataclass, field
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


_VERDICT_WORD = re.compile(
    r"(?<![A-Za-z])(?:(?P<un>un)?accept(?P<form>s|ed|able|ing)?|reject(?:s|ed|ing)?)(?![A-Za-z])", re.I)
"""A verdict word, whole words only ("acceptance", "ACCEPTREJECT" are none)."""
_VERDICT_ECHO = re.compile(r"(?<![A-Za-z])(?:accept\s*(?:or|/|\|)\s*reject|reject\s*(?:or|/|\|)\s*accept)(?![A-Za-z])",
                           re.I)
"""The prompt's "ACCEPT or REJECT" repeated back: not a verdict."""
_VERDICT_FIELD = re.compile(
    r"(?:<verdict>|(?<![A-Za-z])(?:final\s+)?(?:verdict|decision|judge?ment|answer|conclusion|result)\W{0,3}?[:=])"
    r"[\s*_`\"'\[(<>-]*(?:not\s+)?", re.I)
"""A structured field ("Verdict: X", "**Decision:** X", "<verdict>X</verdict>"), up to where its value starts."""
_VERDICT_LEAD = re.compile(r"[\s*_`\"'\[(<>#-]*(?:not\s+)?", re.I)
"""What may precede a verdict at the very start of the reply: markdown, quotes, a "not"."""
_NEGATORS = frozenset("not no never nothing nor neither cannot unable refuse refuses".split())
_CLAUSE_STARTS = frozenset("but however yet though although so therefore thus hence and because".split())
_AFFIRMING_BE = re.compile(r"(?<![A-Za-z])(?:is|are|be|was|were|been|seems|looks|appears)\s+"
                           r"(?:(?:fully|entirely|perfectly|completely|clearly|definitely)\s+)?$", re.I)


def _negated(text: str, start: int) -> bool:
    """Is there a negation among the five words before `start`, in the same clause? ("I do not accept",
    "should not be accepted", "I don't think we should accept", "can't accept", "nothing to reject")"""
    clause = re.split(r"[.!?;:,\n()]", text[:start])[-1]
    words = [w.lower().replace("\u2019", "'") for w in re.findall(r"[A-Za-z]+(?:['\u2019][A-Za-z]+)?", clause)]
    for i in range(len(words) - 1, -1, -1):
        if words[i] in _CLAUSE_STARTS:  # "it is not perfect but I accept": the negation is in another clause
            words = words[i + 1:]
            break
    return any(w in _NEGATORS or w.endswith("n't") for w in words[-5:])


def _in_question(text: str, end: int) -> bool:
    """Does the sentence around text[end] end with '?' ("Should we accept?" is no verdict)?"""
    m = re.search(r"[.!?\n]", text[end:])
    return m is not None and m.group() == "?"


_CONDITION = re.compile(r"[\s,]*(?:only\s+)?(?:if|unless|when|provided)(?![A-Za-z])", re.I)
"""A verdict word followed by a condition ("Accept if correct", "I would accept if ...") is no verdict."""


def _verdict_of(text: str, m: re.Match, affirming: bool) -> str | None:
    """What one verdict word says, or None when it says nothing (a negated "reject", an attributive
    "acceptable", "accepted" outside a verdict position)."""
    negated = _negated(text, m.start())
    if m.group().lower().startswith("reject"):
        return None if negated else "REJECT"
    if m.group("un"):  # unacceptable, unaccepted
        return None if negated else "REJECT"
    if m.group("form") in (None, "s", "ing"):  # accept, accepts, accepting
        return "REJECT" if negated else "ACCEPT"
    if negated:  # not acceptable, not accepted
        return "REJECT"
    # "accepted" / "acceptable" affirm only as the verdict (start of the reply, a field) or as a predicate
    if affirming or _AFFIRMING_BE.search(text[:m.start()]):
        return "ACCEPT"
    return None


def parse_verdict(text: str) -> str:
    """ACCEPT or REJECT, read from a Verifier reply.

    The verdict is a whole word (ACCEPT, **REJECT**, "I accept this") or a field ("Verdict: accept",
    "Decision: REJECT", "<verdict>ACCEPT</verdict>"). A negated accept is REJECT: "not acceptable",
    "unacceptable", "cannot/can't/won't/do not accept", "should not be accepted". "accepted"/"acceptable"
    affirm only where a verdict stands (start of the reply, a field) or as a predicate ("the answer is
    acceptable"); "an acceptable format" says nothing. Nor do a negated reject ("nothing to reject"), a
    question ("Should we accept?"), a condition ("Accept if correct") and the prompt's "ACCEPT or REJECT"
    echoed back. Of what is left, a verdict at the very start of the reply decides, else the first field,
    else the first verdict word; with none, REJECT. Text before a closing </think> is ignored when
    something follows it.
    """
    i = text.rfind("</think>")
    if i >= 0 and text[i + len("</think>"):].strip():
        text = text[i + len("</think>"):]
    text = _VERDICT_ECHO.sub(lambda e: " " * len(e.group()), text)
    fields = {f.end() for f in _VERDICT_FIELD.finditer(text)}
    lead = _VERDICT_LEAD.match(text).end()
    found: list[tuple[int, str, bool]] = []  # (position, verdict, in a field)
    for m in _VERDICT_WORD.finditer(text):
        if _in_question(text, m.end()) or _CONDITION.match(text, m.end()):
            continue
        in_field = m.start() in fields
        verdict = _verdict_of(text, m, affirming=in_field or m.start() == lead)
        if verdict:
            found.append((m.start(), verdict, in_field))
    if not found:
        return "REJECT"
    if found[0][0] == lead:
        return found[0][1]
    return next((v for _, v, in_field in found if in_field), found[0][1])


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
