"""An OpenAI-style message list as what `trinity.serving.conversation` plays: `chat_messages` validates it,
`task_from_messages` turns it into the `Task` of an episode. The whole conversation drives the route: the coordinator
LM reads every earlier turn (`roles.coordinator_text`), the Worker sees them as real messages, Thinker and Verifier as
"Conversation so far". Mapping:
  * `system` / `developer` messages are instructions: their text (in order) is put before the first user
    message, separated by a blank line. The role prompts' own system messages stay the ones the coordinator
    was trained with;
  * the last message must be a user message: it is the question (`Task.query`);
  * earlier user / assistant messages become `Task.history` pairs (consecutive messages of one role are joined
    by a blank line; the conversation must start with a user message);
  * content is a string or a list of text parts; other part types (images, audio), `tool` / `function`
    messages and tool calls are refused with the message's index (`ConversationError`).
"""
from __future__ import annotations

from typing import Any

from trinity.records import ChatMessage, Task, stable_hash

ANSWER_FORMATS: dict[str, str] = {"free": "judge", "math": "math", "choice": "choice", "code": "code"}
"""`answer_format` → the task grader whose answer-format instruction the Worker gets (`roles.ANSWER_FORMAT`):
free = none (an open conversation), math = a final \\boxed{} answer, choice = an 'Answer: X' line, code = one
Python block."""

INSTRUCTION_ROLES = ("system", "developer")
CONVERSATION_ROLES = ("user", "assistant")


class ConversationError(ValueError):
    """A message list that cannot be played as a conversation; `param` names where (e.g. 'messages[2].role')."""

    def __init__(self, message: str, param: str | None = "messages"):
        super().__init__(message)
        self.param = param


def _content_text(content: Any, where: str) -> str:
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        parts = []
        for j, part in enumerate(content):
            if not isinstance(part, dict) or part.get("type") != "text" or not isinstance(part.get("text"), str):
                kind = part.get("type") if isinstance(part, dict) else type(part).__name__
                raise ConversationError(f"{where}.content[{j}]: part type {kind!r} is not supported (text parts only)",
                                        f"{where}.content[{j}]")
            parts.append(part["text"])
        return "\n".join(parts)
    if content is None:
        raise ConversationError(f"{where}.content is missing or null (tool calls are not supported)",
                                f"{where}.content")
    raise ConversationError(f"{where}.content must be a string or a list of text parts, got {type(content).__name__}",
                            f"{where}.content")


def chat_messages(messages: Any) -> list[ChatMessage]:
    """Validate an OpenAI-style message list and return it as ChatMessages (developer → system)."""
    if messages is None:
        raise ConversationError("'messages' is required")
    if not isinstance(messages, list):
        raise ConversationError(f"'messages' must be a list of message objects, got {type(messages).__name__}")
    if not messages:
        raise ConversationError("'messages' is empty: send at least one user message")
    out = []
    for i, m in enumerate(messages):
        where = f"messages[{i}]"
        if not isinstance(m, dict):
            raise ConversationError(f"{where} must be an object with 'role' and 'content', got {type(m).__name__}",
                                    where)
        role = m.get("role")
        if role not in INSTRUCTION_ROLES + CONVERSATION_ROLES:
            raise ConversationError(f"{where}.role {role!r} is not supported (expected one of "
                                    f"{', '.join(INSTRUCTION_ROLES + CONVERSATION_ROLES)})", f"{where}.role")
        if m.get("tool_calls") or m.get("function_call"):
            raise ConversationError(f"{where}: tool calls are not supported", f"{where}.tool_calls")
        out.append(ChatMessage("system" if role == "developer" else role, _content_text(m.get("content"), where)))
    return out


def task_from_messages(messages: Any, answer_format: str = "free") -> Task:
    """The task an episode plays for a conversation (mapping: module doc). Raises ConversationError."""
    grader = ANSWER_FORMATS.get(answer_format)
    if grader is None:
        raise ConversationError(f"answer_format {answer_format!r}: expected one of {', '.join(ANSWER_FORMATS)}",
                                "answer_format")
    msgs = chat_messages(messages)
    instructions = [m.content.strip() for m in msgs if m.role == "system" and m.content.strip()]
    turns: list[list] = []  # [role, [texts], first index]
    for i, m in enumerate(msgs):
        if m.role == "system":
            continue
        if turns and turns[-1][0] == m.role:
            turns[-1][1].append(m.content)
        else:
            turns.append([m.role, [m.content], i])
    if not turns:
        raise ConversationError("'messages' holds no user message")
    if turns[0][0] != "user":
        raise ConversationError(f"messages[{turns[0][2]}]: an assistant message before any user message",
                                f"messages[{turns[0][2]}]")
    if turns[-1][0] != "user":
        raise ConversationError(f"the last message must be the user's question, got an assistant message "
                                f"(messages[{len(msgs) - 1}])", f"messages[{len(msgs) - 1}]")
    texts = ["\n\n".join(t[1]) for t in turns]
    if instructions:
        texts[0] = "\n\n".join([*instructions, texts[0]])
    if not texts[-1].strip():
        raise ConversationError(f"messages[{len(msgs) - 1}].content is empty", f"messages[{len(msgs) - 1}].content")
    history = tuple(zip(texts[:-1:2], texts[1:-1:2]))
    ident = stable_hash({"history": history, "query": texts[-1], "grader": grader})[:16]
    return Task(id=f"chat/{ident}", source="chat", prompt=(texts[-1],), grader=grader, history=history)
