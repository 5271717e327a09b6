"""Math answers: pull the final answer out of a model's reply and compare it with the reference.

Extraction, in order of preference: the last \\boxed{...} (or \\fbox{...}); the last explicit statement
("the answer is X", "Final answer: X", "Answer: X"); the last number in the text. Text before a closing
</think> is ignored when something follows it.

Comparison depends on `task.metadata["answer_type"]`:
* "integer" (AIME): both sides as integers — "073", "73", "73.0" and "\\boxed{073}" are all 73.
* "number"  (GSM8K): exact rational comparison after dropping "$", thousands commas, "%" and units.
* "latex"   (MATH-500, the default): plain numbers compare exactly; anything else goes through
  math-verify (`parse` + `verify`), which understands LaTeX, sets, intervals, equations, etc.

math-verify can take unbounded time on adversarial input (10^{10^{10}}, 10^8!, (x+1)^{100000}). In the
main thread its own signal-based timeouts apply. signal.alarm does not work off the main thread, so
there the comparison runs in a helper process that is killed when it overruns.
"""
from __future__ import annotations

import multiprocessing
import re
import threading
from fractions import Fraction
from typing import Any

from trinity.records import Task

DEFAULT_TIMEOUT_S = 5
"""Seconds math-verify may spend on one parse or one comparison (signal.alarm: whole seconds)."""
MAX_ANSWER_CHARS = 1000
"""Longer extracted answers are treated as wrong: no reference answer is anywhere near this long."""

# ---------------------------------------------------------------------------------------------------
# Extraction


def _after_think(text: str) -> str:
    i = text.rfind("</think>")
    if i >= 0 and text[i + len("</think>"):].strip():
        return text[i + len("</think>"):]
    return text


def _balanced(text: str, start: int) -> str | None:
    """Content of the brace group opening at text[start] == '{', or None if it never closes."""
    depth = 0
    for i in range(start, len(text)):
        c = text[i]
        if c == "{" and text[i - 1: i] != "\\":
            depth += 1
        elif c == "}" and text[i - 1: i] != "\\":
            depth -= 1
            if depth == 0:
                return text[start + 1: i]
    return None


_BOXED = re.compile(r"\\(?:boxed|fbox)\s*(\{|\s+[^\s$]+)")


def last_boxed(text: str) -> str | None:
    """Content of the last \\boxed{...} / \\fbox{...} (balanced braces; also "\\boxed 5")."""
    found = None
    for m in _BOXED.finditer(text):
        if m.group(1) == "{":
            inner = _balanced(text, m.start(1))
            if inner is not None:
                found = inner
        else:
            found = m.group(1).strip()
    return found


_STATEMENT = re.compile(
    r"(?i:final\s+answer|the\s+answer|answer)\s*(?:is|:|=|would\s+be|should\s+be)\s*:?\s*(?P<ans>[^\n]+)"
)
_NUMBER = re.compile(r"-?\$?\s?(?:\d{1,3}(?:,\d{3})+|\d+)(?:\.\d+)?(?:\s*/\s*\d+)?")


def _clean_span(s: str) -> str:
    s = s.strip()
    s = re.sub(r"^\*+|\*+$", "", s).strip()  # markdown bold around the answer
    for a, b in (("$$", "$$"), ("$", "$"), ("\\(", "\\)"), ("\\[", "\\]")):
        if s.startswith(a):
            j = s.find(b, len(a))
            if j > 0:
                s = s[len(a): j]
                break
    s = s.strip()
    s = re.sub(r"[\s.;,!*]+$", "", s)  # trailing sentence punctuation
    return s.strip()


def extract_final_answer(text: str | None) -> str | None:
    """The final answer as a string (still LaTeX), or None if the reply states none."""
    if not text:
        return None
    text = _after_think(text)
    boxed = last_boxed(text)
    if boxed is not None and boxed.strip():
        return boxed.strip()
    statements = list(_STATEMENT.finditer(text))
    for m in reversed(statements):
        span = _clean_span(m.group("ans"))
        if span:
            return span
    numbers = _NUMBER.findall(text)
    if numbers:
        return numbers[-1].replace("$", "").replace(" ", "")
    return None


# ---------------------------------------------------------------------------------------------------
# Comparison

_UNITS = re.compile(r"\s*(?:\\(?:text|mbox|mathrm)\{[^{}]*\}|[a-zA-Z ]+)$")


def as_number(s: str) -> Fraction | None:
    """A plain number ("1,234.50", "$18", "-3/4", "45%", "073", "12 dollars") as a Fraction, else None."""
    s = s.strip()
    s = re.sub(r"\\[!,;: ]|\\\$|\\%|\$|\\left|\\right|\{,\}", "", s).replace("\u2212", "-").strip()
    s = _UNITS.sub("", s).strip().rstrip("%").strip()
    if re.fullmatch(r"\(?\s*-?\d{1,3}(,\d{3})+(\.\d+)?\s*\)?", s) or re.fullmatch(r"-?\d{1,3}(,\d{3})+(\.\d+)?", s):
        s = s.replace(",", "")
    s = s.strip("() ")
    if len(s) > 100:
        return None
    m = re.fullmatch(r"(-?)(\d+(?:\.\d*)?|\.\d+)(?:\s*/\s*(\d+))?", s)
    if not m:
        frac = re.fullmatch(r"(-?)\\[dt]?frac\{(\d+)\}\{(\d+)\}", s)
        if not frac or int(frac.group(3)) == 0:
            return None
        v = Fraction(int(frac.group(2)), int(frac.group(3)))
        return -v if frac.group(1) else v
    num = Fraction(m.group(2))
    if m.group(3) is not None:
        if int(m.group(3)) == 0:
            return None
        num /= int(m.group(3))
    return -num if m.group(1) else num


def _math_verify_equal(gold: str, pred: str, timeout_s: int | None) -> bool:
    """math-verify comparison of a reference and an extracted answer (both LaTeX-ish strings)."""
    from math_verify import ExprExtractionConfig, LatexExtractionConfig, parse, verify

    cfg = [LatexExtractionConfig(), ExprExtractionConfig()]
    g = parse(f"${gold}$", extraction_config=cfg, parsing_timeout=timeout_s)
    if not g:
        g = parse(f"\\boxed{{{gold}}}", extraction_config=cfg, parsing_timeout=timeout_s)
    if not g:
        return False
    for candidate in (f"\\boxed{{{pred}}}", f"${pred}$"):
        p = parse(candidate, extraction_config=cfg, parsing_timeout=timeout_s)
        if p and verify(g, p, timeout_seconds=timeout_s):
            return True
    return False


def _worker_main(conn) -> None:  # runs in the helper process's main thread, where signal.alarm works
    while True:
        try:
            gold, pred, timeout_s = conn.recv()
        except EOFError:
            return
        try:
            ok = _math_verify_equal(gold, pred, timeout_s)
        except Exception:
            ok = False
        conn.send(ok)


class _VerifyProcess:
    """One helper process for math-verify calls made off the main thread; killed and restarted on overrun."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._proc: Any = None
        self._conn: Any = None

    def _start(self) -> None:
        ctx = multiprocessing.get_context("spawn")  # never fork a threaded process
        parent, child = ctx.Pipe()
        proc = ctx.Process(target=_worker_main, args=(child,), daemon=True, name="trinity-math-verify")
        proc.start()
        child.close()
        self._proc, self._conn = proc, parent

    def _stop(self) -> None:
        if self._proc is not None:
            self._proc.kill()
            self._proc.join(timeout=5)
            self._conn.close()
        self._proc = self._conn = None

    def equal(self, gold: str, pred: str, timeout_s: int, hard_timeout_s: float) -> bool:
        with self._lock:
            if self._proc is None or not self._proc.is_alive():
                self._stop()
                self._start()
            try:
                self._conn.send((gold, pred, timeout_s))
                # The first call also pays for the process start and the sympy import.
                if self._conn.poll(hard_timeout_s):
                    return bool(self._conn.recv())
            except (EOFError, OSError, BrokenPipeError):
                pass
            self._stop()
            return False


_VERIFY_PROCESS = _VerifyProcess()


def math_equal(gold: str, pred: str, answer_type: str = "latex", timeout_s: int = DEFAULT_TIMEOUT_S) -> bool:
    """Is the extracted answer `pred` equal to the reference `gold`?"""
    pred = pred.strip()
    if not pred or len(pred) > MAX_ANSWER_CHARS:
        return False
    g_num, p_num = as_number(gold), as_number(pred)
    if answer_type == "integer":
        if g_num is not None and p_num is not None:
            return p_num.denominator == 1 and p_num == g_num
    elif g_num is not None and p_num is not None:
        return g_num == p_num
    elif answer_type == "number" and g_num is not None and re.fullmatch(r"[\d\s.,$%/-]+", pred):
        return False  # both look numeric but one did not parse: not equal
    if threading.current_thread() is threading.main_thread():
        try:
            return _math_verify_equal(gold, pred, timeout_s)
        except Exception:
            return False
    # Up to 2 parses per side and 4 comparisons, each bounded by timeout_s, plus the helper's start-up.
    return _VERIFY_PROCESS.equal(gold, pred, timeout_s, hard_timeout_s=8 * timeout_s + 30)


def grade_math(task: Task, answer_text: str | None, timeout_s: int = DEFAULT_TIMEOUT_S) -> float:
    """1.0 if the reply's final answer equals task.answer, else 0.0 (no answer found counts as wrong)."""
    if task.answer is None:
        raise ValueError(f"task {task.id}: a math task needs a reference answer")
    pred = extract_final_answer(answer_text)
    if pred is None:
        return 0.0
    answer_type = task.metadata.get("answer_type", "latex")
    return 1.0 if math_equal(task.answer, pred, answer_type, timeout_s) else 0.0
