"""Multiple-choice answers: find the letter a reply commits to.

Tiers, strongest first; within a tier the last occurrence wins (models restate their final pick last):
1. \\boxed{B} (also \\boxed{\\text{B}}, \\boxed{(B)}).
2. Explicit statements: "Answer: B", "The answer is (B).", "Final answer: **B**", "the correct option is B",
   "B is correct", "I choose B".
3. Formatted letters: "**B**", "(B)", a line starting "B)" / "B." / "B:". Used only when they point to one
   letter, or when the reply's last line points to one (a reply that walks through A), B), C), D) commits
   to none of them).
4. A lone letter: the whole reply, or its last line, is just "B" (markup and punctuation aside).
5. The stated answer, or the whole reply, is exactly the text of one option (needs the option texts).
Nothing found → None, which grades as wrong. Text before a closing </think> is ignored.
A hedge is no answer: when the letter a tier finds stands in a list of letters offered together as the answer
("Answer: A or B", "A/B", "A, B", "(A) or (C)", "A and B", "either A or B", "A or B is correct",
"\\boxed{A} or \\boxed{B}"), naming more than one distinct letter, the reply commits to none (None). Only
letters joined to the found one by such a connector count: "Answer: (B) because option A is wrong" is B.
"""
from __future__ import annotations

import re
from typing import Sequence

from trinity.grading.reply import after_think
from trinity.records import Task

LETTERS = "ABCD"

# markup that may precede the letter; possessive (*+, ++) here and in the patterns below, so a long run of blanks
# costs linear time, not the polynomial backtracking of several adjacent \s* ("Answer:" + 1000 spaces took 15 s)
_OPEN = r"(?:[\s*_(\[{\"'`$]|\\text(?:bf)?\{|\\mathrm\{|\\textbf\{)*+"
_END = r"(?![A-Za-z0-9])"
_HEDGE = r"(?i:(?:either|maybe|perhaps|possibly|probably|likely)\s+)?"  # "Answer: either A or B" still finds A
# After a letter: closing markup, then a connector that adds another letter to the answer ("A or B", "A/B",
# "A, B", "(A) or (C)", "A and B", "A, or maybe B", "A. Or B"), then that letter in its own markup.
_CLOSE = r"[\s*_)\]}\"'`$]*"
_CONNECT = (r"(?:\s*+(?:[,/&]|\bor\b|\band\b)|\.\s++(?=(?i:or|maybe|perhaps|possibly)\b))"
            r"(?:\s*+(?:(?i:or|and|maybe|perhaps|possibly|probably|even|also)\b|[,/&]))*+\s*+")
_TOKEN_OPEN = r"(?:[\s*_(\[{\"'`$]|\\text(?:bf)?\{|\\mathrm\{|\\textbf\{|\\boxed\s*\{)*+"  # _OPEN, or \boxed{


def _letter_class(letters: str) -> str:
    return "[" + re.escape(letters) + "]"


def _patterns(letters: str) -> dict[str, list[re.Pattern]]:
    L = _letter_class(letters)
    return {
        "boxed": [re.compile(r"\\boxed\s*\{\s*(?:\\text(?:bf)?\{|\\mathrm\{)?\s*\(?\s*(" + L + r")\s*\)?\s*\}?\s*\}")],
        "statement": [
            # "final answer B", "correct option: (B)", "the best choice is **B**"
            re.compile(
                r"(?i:\b(?:final|correct|right|best)\s+(?:answer|option|choice))"
                r"\s*+(?i:is|:|=|would\s+be|should\s+be|must\s+be|will\s+be)?\s*+(?i:option|choice)?\s*+[:\-]?"
                + _OPEN + _HEDGE + _OPEN + "(" + L + ")" + _END
            ),
            # a bare "answer" needs a verb or a colon: "Answer: B", "the answer is (B)"
            re.compile(
                r"(?i:\banswer)\s*+(?i:is|:|=|would\s+be|should\s+be|must\s+be|will\s+be)\s*+(?i:option|choice)?\s*+[:\-]?"
                + _OPEN + _HEDGE + _OPEN + "(" + L + ")" + _END
            ),
            re.compile(r"(?i:\b(?:option|choice)\s+)?\(?(" + L + r")\)?\s+(?i:is\s+(?:the\s+)?(?:correct|right|best|answer)\b)"),
            re.compile(r"(?i:\b(?:i\s+(?:would\s+)?(?:choose|pick|select|go\s+with)|i'd\s+(?:choose|pick|select|go\s+with)))"
                       r"\s++(?i:option\s++)?" + _OPEN + _HEDGE + _OPEN + "(" + L + ")" + _END),
        ],
        "formatted": [
            re.compile(r"\*\*\s*\(?(" + L + r")\)?[.):]?\s*\*\*"),
            re.compile(r"\((" + L + r")\)"),
            re.compile(r"(?m)^\s*(?:[-*]\s*)?(" + L + r")[).:](?:\s|$)"),
        ],
    }


def _hedged(text: str, pos: int, letters: str) -> bool:
    """Does the letter at text[pos] stand in a list of different letters offered as the answer? Looks ahead
    ("A or B", "A, B", "(A)/(B)") and one step back with a word or slash ("A or B is correct")."""
    L = _letter_class(letters)
    nxt = re.compile(_END + _CLOSE + "+" + _CONNECT + _TOKEN_OPEN + "(" + L + ")" + _END)
    seen, at = {text[pos]}, pos + 1
    while (m := nxt.match(text, at)) is not None:
        seen.add(m.group(1))
        at = m.end(1)
    prev = re.search(r"(?<![A-Za-z0-9])(" + L + r")" + _CLOSE + r"(?:\s*/|\s+(?i:or|and)\b|\s*&)\s*"
                     + _TOKEN_OPEN + _HEDGE + _TOKEN_OPEN + r"$", text[max(0, pos - 200): pos])
    if prev:
        seen.add(prev.group(1))
    return len(seen) > 1


def _last(patterns: list[re.Pattern], text: str) -> tuple[int, str] | None:
    best = None
    for p in patterns:
        for m in p.finditer(text):
            if best is None or m.start(1) >= best[0]:
                best = (m.start(1), m.group(1))
    return best


def _norm(s: str) -> str:
    return re.sub(r"[\s$*`.]+", " ", s).strip().lower()


def extract_choice(text: str | None, letters: str = LETTERS, choices: Sequence[str] | None = None) -> str | None:
    """The letter the reply commits to (one of `letters`), or None."""
    if not text or not text.strip():
        return None
    text = after_think(text)
    pats = _patterns(letters)
    for tier in ("boxed", "statement"):
        hit = _last(pats[tier], text)
        if hit:
            return None if _hedged(text, hit[0], letters) else hit[1]
    found = {m.group(1) for p in pats["formatted"] for m in p.finditer(text)}
    if len(found) == 1:
        return found.pop()
    lines = [ln for ln in text.strip().splitlines() if ln.strip()]
    if found:
        # Lines starting "A)", "B)", … for several letters are a walk through the options, not a pick.
        bold, paren, line_start = pats["formatted"]
        listing = len({m.group(1) for m in line_start.finditer(text)}) > 1
        last_line = {m.group(1) for p in ([bold, paren] if listing else pats["formatted"]) for m in p.finditer(lines[-1])}
        if len(last_line) == 1:
            return last_line.pop()
    bare = re.compile(r"[\s*_`'\".:()\[\]{}$]*(" + _letter_class(letters) + r")[\s*_`'\".:()\[\]{}$]*")
    for candidate in (text, lines[-1]):
        m = bare.fullmatch(candidate)
        if m:
            return m.group(1)
    if choices:
        options = {_norm(c): letters[i] for i, c in enumerate(choices[: len(letters)])}
        if len(options) == len(choices[: len(letters)]):  # duplicate option texts cannot identify a letter
            stated = re.findall(r"(?i:answer)\s*(?i:is|:)\s*([^\n]+)", text)
            for candidate in ([stated[-1]] if stated else []) + [text]:
                key = _norm(candidate)
                if key in options:
                    return options[key]
    return None


def grade_choice(task: Task, answer_text: str | None) -> float:
    """1.0 if the reply's letter equals task.answer, else 0.0."""
    if not task.answer or len(task.answer) != 1:
        raise ValueError(f"task {task.id}: a choice task needs a single-letter answer, got {task.answer!r}")
    choices = task.metadata.get("choices")
    letters = LETTERS[: len(choices)] if choices and len(choices) <= len(LETTERS) else LETTERS
    return 1.0 if extract_choice(answer_text, letters, choices) == task.answer.strip().upper() else 0.0
