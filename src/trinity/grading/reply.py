"""A reply with its reasoning set aside, for the answer extractors of the math and choice graders.

Reasoning models write <think>…</think> before the answer. Two other readers cut the reasoning differently on
purpose, and keep their own rule: `grading.code.extract_code` always reads only what follows the last </think>
(even when nothing does), and the verifier's verdict (`trinity.verdict.parse_verdict`) also drops an unclosed
<think> and what follows it (a reply cut inside its reasoning has no verdict).
"""
from __future__ import annotations


def after_think(text: str) -> str:
    """What follows the last </think> when that is not blank; else the whole text (a reply whose final answer
    sits inside the reasoning is still read)."""
    i = text.rfind("</think>")
    if i >= 0 and text[i + len("</think>"):].strip():
        return text[i + len("</think>"):]
    return text
