"""The Verifier's verdict, defined once: its values (`VERDICTS`), how a reply carries it (a last line `Verdict:
ACCEPT`, or the "verdict" member of a JSON object) and how it is read (`parse_verdict`), and how each kind of member
is held to that shape when a request's `SamplingParams.output_format` is `VERDICT_FORMAT`: local members decode under
a GBNF grammar (`verdict_grammar`), API members get a JSON schema as structured output (`VERDICT_RESPONSE_FORMAT`).
What the Verifier is asked is its role prompt (`trinity.coordinator.roles`); that its request asks for this format is
the coordinator's role table (`trinity.coordinator.role_sampling`)."""
from __future__ import annotations

import json
import re
from typing import Any

VERDICTS: tuple[str, ...] = ("ACCEPT", "REJECT")
VERDICT_FORMAT = "verdict"
"""The output format of a Verifier's request (`SamplingParams.output_format`)."""


_FIELD = re.compile(r"verdict\s*:(?P<value>.*)", re.I)
_MARKUP = str.maketrans("", "", "*`_")
_FENCE = re.compile(r"^```(?:json)?\s*(?P<body>.*?)\s*```$", re.I | re.S)


def parse_verdict(text: str) -> str | None:
    """The verdict field of a Verifier reply: "ACCEPT", "REJECT", or None when the reply has no such field.

    The field is the last line that starts with "Verdict:" (case, markdown bold/backticks and surrounding
    whitespace aside; a trailing full stop is allowed); its value must be exactly ACCEPT or REJECT, else there
    is no verdict. An API member under `response_format` replies with a JSON object, whose "verdict" member is
    the field. Nothing else is read: prose ("I accept.", "It is impossible to accept this answer.") is no
    verdict, and a reply without a verdict does not end the episode. Only what follows the last </think> is
    the reply (a reply cut inside an unclosed <think> has none).
    """
    i = text.rfind("</think>")
    if i >= 0:
        text = text[i + len("</think>"):]
    elif "<think>" in text:
        text = text[:text.index("<think>")]
    body = text.strip()
    fenced = _FENCE.match(body)
    if fenced:
        body = fenced.group("body")
    if body.startswith("{"):
        try:
            obj = json.loads(body)
        except json.JSONDecodeError:
            obj = None
        if isinstance(obj, dict):
            value = obj.get("verdict")
            return _verdict_value(value) if isinstance(value, str) else None
    for line in reversed(text.splitlines()):
        m = _FIELD.match(line.translate(_MARKUP).strip())
        if m:
            return _verdict_value(m.group("value"))
    return None


def _verdict_value(value: str) -> str | None:
    """ACCEPT / REJECT from a field's value (any case, an optional full stop); None for anything else."""
    v = value.strip()
    v = v[:-1].rstrip() if v.endswith(".") else v
    return v.upper() if v.upper() in VERDICTS else None


VERDICT_FIELD_TOKENS = 8
"""Tokens kept for the verdict line ("\nVerdict: ACCEPT" is 4-6 tokens in the bundled models' vocabularies)."""
VERDICT_REASON_CHARS_PER_TOKEN = 2
"""Characters of reason allowed per token of max_tokens left after the field: a pessimistic density (the
bundled models' Verifier reasons average about 3-4 characters per token; digits and LaTeX run denser)."""


def verdict_grammar(max_tokens: int) -> str:
    """The GBNF grammar of a "verdict" reply within `max_tokens`: an optional one-line reason of at most
    VERDICT_REASON_CHARS_PER_TOKEN x (max_tokens - VERDICT_FIELD_TOKENS) characters, then the field."""
    chars = VERDICT_REASON_CHARS_PER_TOKEN * (max_tokens - VERDICT_FIELD_TOKENS)
    field = 'root ::= {}"Verdict: " (' + " | ".join(f'"{v}"' for v in VERDICTS) + ')\n'
    return field.format(f'([^\\n]{{1,{chars}}} "\\n")? ' if chars > 0 else "")


VERDICT_RESPONSE_FORMAT: dict[str, Any] = {
    "type": "json_schema",
    "json_schema": {
        "name": "verdict",
        "strict": True,
        "schema": {
            "type": "object",
            "properties": {"reason": {"type": "string"}, "verdict": {"type": "string", "enum": list(VERDICTS)}},
            "required": ["reason", "verdict"],
            "additionalProperties": False,
        },
    },
}
"""The Verifier's reply as structured output: one short reason, then the verdict field (reason first, as in
the text form: the verdict is decoded after it)."""
